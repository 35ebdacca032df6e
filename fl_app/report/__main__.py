"""``python -m fl_app.report``: see ``fl_app.report.cli``."""

import sys

from fl_app.report.cli import main

sys.exit(main())
