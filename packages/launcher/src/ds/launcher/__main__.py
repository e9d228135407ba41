"""``python -m ds.launcher ...``: the ds command line under any name (see ds.launcher.owner)."""

import sys

from ds.launcher.cli import main

sys.exit(main())
