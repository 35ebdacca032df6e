"""`python -m fl_app.deploy STEP ...`: see fl_app.deploy.cli."""

import sys

from fl_app.deploy.cli import main

main(sys.argv[1:])
