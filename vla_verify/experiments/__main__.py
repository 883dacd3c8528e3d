"""``python -m vla_verify.experiments``: run grids, report them, list their jobs."""

import sys

from .cli import main

sys.exit(main())
