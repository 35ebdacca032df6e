"""``python -m experiments.runner ...``: the suite runner's command line (see the package's docstring)."""

import sys

from experiments.runner import main

sys.exit(main())
