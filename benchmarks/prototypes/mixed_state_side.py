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
import json
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
COUNTEREXAMPLE = ROOT / "tests" / "data" / "triton_chunked_bf16_state_carry.npz"
SCHEMES = ("float32", "mixed", "bf16")


def _scheme(name: str) -> None:
    import torch

    from vla_verify.backends import triton_chunked as tc

    if not hasattr(tc, "_backend_state_dtype"):
        tc._backend_state_dtype = tc._state_dtype  # type: ignore[attr-defined]
    tc._UT_OPERAND_DTYPE = torch.bfloat16 if name == "bf16" else torch.float32
    if name == "float32":
        tc._state_dtype = lambda dtype, training: torch.float32  # type: ignore[assignment]
    else:
        tc._state_dtype = tc._backend_state_dtype  # type: ignore[attr-defined]


def study(seeds: list[int], schemes: tuple[str, ...] = SCHEMES) -> dict[str, Any]:
    from vla_verify.conformance import conformance
    from vla_verify.validation import replay

    out: dict[str, Any] = {"seeds": seeds, "schemes": {}}
    for name in schemes:
        _scheme(name)
        rep = replay(COUNTEREXAMPLE, "triton_chunked")
        worst = rep.worst_ratio if rep.passed else max(
            max((c.ratio for c in f.comparisons), default=float("nan")) for f in rep.failures
        )  # fmt: skip
        row: dict[str, Any] = {"counterexample": {"passed": rep.passed, "ratio": worst},
                               "conformance": []}  # fmt: skip
        for seed in seeds:
            t0 = time.time()
            for r in conformance(["triton_chunked"], seed=seed, show_progress=False):
                if r.dtype == "bfloat16":
                    row["conformance"].append({
                        "seed": seed, "verdict": r.verdict, "examples": r.examples,
                        "worst_ratio": r.worst_ratio, "seconds": round(time.time() - t0),
                        "note": r.note[:300],
                    })  # fmt: skip
            print(name, row["conformance"][-1], flush=True)
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
