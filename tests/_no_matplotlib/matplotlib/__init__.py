"""Stands in for matplotlib where a test leaves the report's plots out (``tests/_no_plots.py``):
first on a command's path, the report is written without plots, as where matplotlib is not
installed."""

raise ImportError("matplotlib is left out of this test's commands (tests/_no_plots.py)")
