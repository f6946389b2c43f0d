"""``python -m trio_coord.cli``: the command line, as ``trio-coord``."""

import sys

from . import main

sys.exit(main())
