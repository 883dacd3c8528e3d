"""``python -m vla_verify.experiments``: run grids, report them, list their jobs."""

import sys

from .cli import main

if __name__ == "__main__":  # the runner's spawned workers import this module again
    sys.exit(main())
