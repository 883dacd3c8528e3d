"""The precision of the chunked forward's state side with bf16 intermediates and the UT
transform's products in float32 operands (the scheme the backend runs for bf16 inputs in
inference), against the spec §4 bf16 budget, under Triton's interpreter on the CPU.

Three schemes of the bf16 inference forward, set on the backend:

- ``float32``: float32 intermediates, tf32 products (as training runs);
- ``mixed``: the gates, ``K̃``, ``Ṽ``, ``E`` and the chunk-start ``S`` stored in bf16, the state
  chain's and the read-out's products in bf16 operands, the UT transform's in tf32 (the
  backend's);
- ``bf16``: the UT transform's products in bf16 operands too (planted: it fails).

For each: the carry counterexample of ``tests/data`` replayed, and the conformance search of
``vla-verify run`` for ``triton_chunked`` (its plan: 15 examples a dtype) at several seeds.
Under the interpreter the kernels truncate the operands of tf32 products to tf32, as the
tensor cores take float32 registers.  Usage::

    TRITON_INTERPRET=1 python benchmarks/prototypes/mixed_state_side.py OUT.json [--seeds 0 1]
        [--schemes float32 mixed]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
#: This study's schemes, named as the GPU script names them (``mixed`` is its ``backend``).
SCHEMES = {"float32": "float32", "mixed": "backend", "bf16": "bf16"}


def _gpu_script() -> ModuleType:
    """``benchmarks/gpu/state_side_precision.py``, whose schemes and steps this study runs on
    the CPU."""
    path = ROOT / "benchmarks" / "gpu" / "state_side_precision.py"
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def study(seeds: list[int], schemes: tuple[str, ...] = tuple(SCHEMES)) -> dict[str, Any]:
    ssp = _gpu_script()
    out: dict[str, Any] = {"seeds": seeds, "schemes": {}}
    for name in schemes:
        with ssp.scheme(SCHEMES[name]):
            row: dict[str, Any] = {
                "counterexample": ssp.counterexample("cpu", (SCHEMES[name],))[SCHEMES[name]],
                "conformance": ssp.conformance_rows(seeds, deadline=math.inf),
            }
        out["schemes"][name] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4, 5])
    ap.add_argument("--schemes", nargs="+", choices=SCHEMES, default=list(SCHEMES))
    a = ap.parse_args()
    a.out.write_text(json.dumps(study(a.seeds, tuple(a.schemes)), indent=1))


if __name__ == "__main__":
    main()
