"""The GPU benchmarks: ``python benchmarks/gpu/run.py --suite NAME [options]``.

A thin wrapper of ``vla-verify bench`` (:mod:`vla_verify.bench`) for a source checkout that is
not installed: the same options, the same output (``OUT/<suite>.json`` and ``.png``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from vla_verify import bench


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="run.py", description=__doc__.splitlines()[0])
    bench.add_arguments(parser)
    return bench.main(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
