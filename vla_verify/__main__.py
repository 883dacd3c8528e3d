"""``python -m vla_verify`` is ``vla-verify``."""

import sys

from .cli import main

sys.exit(main())
