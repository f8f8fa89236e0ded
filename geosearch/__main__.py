from geosearch.cli import entry

entry()
