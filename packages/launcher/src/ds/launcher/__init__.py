"""ds.launcher: The ds command line: run, report and the verbs other distributions plug in."""
