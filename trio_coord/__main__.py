"""``python -m trio_coord``: the same as the ``trio-coord`` command."""

import sys

from .cli import main

sys.exit(main())
