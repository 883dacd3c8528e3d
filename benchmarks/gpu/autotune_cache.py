"""Keep Triton's autotuning results between GPU machines.

fla's chunk kernels are ``triton.autotune``-d: the first call at a new shape compiles and times
every configuration (more than 200 s at D = 128 on the H200), on every fresh machine.  Triton
stores each result as ``<TRITON_CACHE_DIR>/<key>/<kernel>.autotune.json`` (fla passes
``cache_results=True``), the key a hash of the Triton build, the GPU target, the kernel's source,
the tuning key and the configurations: a result stays valid on any machine with the same GPU
and the same Triton and fla versions, and is never used elsewhere.  ``restore`` copies stored
results into the cache before a run, ``save`` copies a run's results out of it (only those
files: compiled kernels are rebuilt, which takes seconds per kernel)::

    export TRITON_CACHE_DIR=/tmp/triton_cache
    python benchmarks/gpu/autotune_cache.py restore benchmarks/results/h200/triton_autotune
    python benchmarks/gpu/chunk_h200.py --out "$OUT" ...
    python benchmarks/gpu/autotune_cache.py save "$OUT/triton_autotune"

Copy what ``save`` wrote to ``benchmarks/results/<gpu>/triton_autotune/`` and commit it.  A
path ending in ``.tar`` is one archive instead of a folder, both ways (``save "$OUT/triton_
autotune.tar"``): the device machine hands back a limited number of files per run, and a run of
the chunk grid leaves two dozen results.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

#: The suffix of Triton's autotuning results in its cache.
SUFFIX = ".autotune.json"


def cache_dir() -> Path:
    """The cache Triton uses: ``TRITON_CACHE_DIR``, else its default ``~/.triton/cache``."""
    env = os.environ.get("TRITON_CACHE_DIR")
    return Path(env) if env else Path.home() / ".triton" / "cache"


def copy_results(src: Path, dst: Path) -> list[Path]:
    """Copy every ``<key>/<kernel>.autotune.json`` under ``src`` to the same place under ``dst``
    (an existing file is left as it is: the cache's own result wins); returns the files
    copied, relative to ``dst``."""
    if not src.is_dir():
        raise FileNotFoundError(f"{src}: no such folder")
    copied = []
    for path in sorted(src.rglob(f"*{SUFFIX}")):
        rel = path.relative_to(src)
        target = dst / rel
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        copied.append(rel)
    return copied


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("restore", help="copy stored results into Triton's cache")
    r.add_argument("stored", type=Path, help="a folder of results, or a .tar archive of one")
    s = sub.add_parser("save", help="copy the cache's results to a folder (or a .tar archive)")
    s.add_argument("folder", type=Path)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        if a.command == "restore":
            src, dst = a.stored, cache_dir()
            if src.suffix == ".tar" and src.is_file():
                with tarfile.open(src) as archive:
                    archive.extractall(tmp, filter="data")
                src = Path(tmp)
        else:
            src, dst = cache_dir(), a.folder
        if not src.is_dir():
            print(f"{src}: no such folder", file=sys.stderr)
            return 2
        if dst.suffix == ".tar":
            copied = copy_results(src, Path(tmp))
            with tarfile.open(dst, "w") as archive:
                for rel in copied:
                    archive.add(Path(tmp) / rel, arcname=str(rel))
        else:
            copied = copy_results(src, dst)
    print(f"{len(copied)} autotuning results copied from {src} to {dst}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
