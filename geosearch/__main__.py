from geosearch.cli import main

raise SystemExit(main())
