"""The layer under every other fl_app folder: file writes that never clobber or follow links (``files``), files
shipped inside the package (``resources``) and the command-line tools' shared parser and JSON output (``cli``).
It imports nothing else from fl_app."""
