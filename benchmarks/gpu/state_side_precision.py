"""The chunked bf16 inference forward's state-side precision where the hardware rounds: the
interpreter only emulates the GPU's tf32 products (it truncates their operands) and its
bf16 conversions (:func:`vla_verify.runtime.round_interpreter_bf16_to_nearest`), so the margins
measured on the CPU are checked on the GPU.

Three schemes of the bf16 inference forward, set on the backend (as
``benchmarks/prototypes/mixed_state_side.py`` sets them under the interpreter):

- ``backend``: bf16 intermediates and products (what it runs);
- ``float32``: float32 intermediates, tf32 products (as training runs);
- ``float16``: float16 intermediates and products (planted: it must fail; float16 holds
  three more bits than bf16 but not its range, and the counterexample's queries, 3e-9 to
  4e-7, are float16 subnormals).

Steps, each written to ``OUT`` as it ends:

1. the carry counterexample of ``tests/data`` (which the conformance search of
   ``vla-verify run`` shrank to) replayed on ``--device`` with each scheme;
2. the conformance search of ``vla-verify run`` for ``triton_chunked`` (its bf16 row) at each
   of ``--seeds``, with each of ``--conformance-schemes`` (default: the backend's);
3. :func:`vla_verify.validate` in bf16 for the paper and exact presets at keys 64 and 128
   wide (the checker's default reach, ``--examples`` each), with the backend's scheme.

Usage (on a GPU)::

    python benchmarks/gpu/state_side_precision.py OUT.json [--seeds 0 1 2 3 4 5]
        [--examples 6] [--budget-s 400] [--conformance-schemes backend float32]
        [--counterexample-only]

Under ``TRITON_INTERPRET=1`` with ``--device cpu`` it runs steps 1 and 2 (the tests run step 1:
``seeds`` empty).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
COUNTEREXAMPLE = ROOT / "tests" / "data" / "triton_chunked_bf16_state_carry.npz"
SCHEMES = ("backend", "float32", "float16")


@contextmanager
def scheme(name: str) -> Iterator[None]:
    """The backend with the state-side scheme ``name`` (one of :data:`SCHEMES`) inside."""
    import torch

    from vla_verify.backends import triton_chunked as tc

    if name not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {name!r}")
    saved = tc._state_dtype
    try:
        if name == "float32":
            tc._state_dtype = lambda dtype, training: torch.float32  # type: ignore[assignment]
        if name == "float16":
            tc._state_dtype = lambda dtype, training: torch.float16  # type: ignore[assignment]
        yield
    finally:
        tc._state_dtype = saved


def _on_device(path: Path, device: str, into: Path) -> Path:
    """A copy of the failure file ``path`` whose case runs on ``device``."""
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(str(arrays.pop("meta")))
    meta["device"] = device
    out = into / path.name
    np.savez(out, meta=np.array(json.dumps(meta)), **arrays)
    return out


def _worst(rep: Any) -> float:
    if rep.passed:
        return float(rep.worst_ratio)
    return max(max((c.ratio for c in f.comparisons), default=float("inf")) for f in rep.failures)


def counterexample(device: str, schemes: tuple[str, ...] = SCHEMES) -> dict[str, Any]:
    """Step 1: the counterexample replayed on ``device`` with each of ``schemes``: ``passed``
    and the worst ratio to the spec §4 budget."""
    from vla_verify.validation import replay

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = _on_device(COUNTEREXAMPLE, device, Path(tmp))
        for name in schemes:
            with scheme(name):
                rep = replay(path, "triton_chunked")
            out[name] = {"passed": rep.passed, "ratio": _worst(rep)}
    return out


def conformance_rows(seeds: list[int], deadline: float) -> list[dict[str, Any]]:
    """Step 2: the bf16 row of the conformance search at each seed, until ``deadline``."""
    from vla_verify.conformance import conformance

    rows: list[dict[str, Any]] = []
    for seed in seeds:
        if time.time() > deadline:
            break
        t0 = time.time()
        for r in conformance(["triton_chunked"], seed=seed, show_progress=False):
            if r.dtype == "bfloat16":
                rows.append({"seed": seed, "verdict": r.verdict, "examples": r.examples,
                             "worst_ratio": r.worst_ratio, "note": r.note[:300],
                             "seconds": round(time.time() - t0, 1)})  # fmt: skip
                print("conformance", rows[-1], flush=True)
    return rows


def validate_rows(examples: int, device: str, deadline: float) -> dict[str, Any]:
    """Step 3: ``validate`` in bf16, paper and exact presets, every example's keys and values
    64 or 128 wide (``head_dims``)."""
    from vla_verify import VLAConfig, backends, validate

    be = backends.get("triton_chunked")
    out: dict[str, Any] = {}
    for name, config in (("paper", VLAConfig()), ("exact", VLAConfig.exact())):
        for dk in (64, 128):
            if time.time() > deadline:
                return out
            t0 = time.time()
            rep = validate(be, config=config, array="torch", dtype="bfloat16", device=device,
                           max_examples=examples, seed=dk, head_dims=(dk,))  # fmt: skip
            out[f"{name}_dk{dk}"] = {
                "passed": rep.passed, "examples": rep.examples, "worst_ratio": rep.worst_ratio,
                "summary": "" if rep.passed else rep.summary()[:600],
                "seconds": round(time.time() - t0, 1),
            }  # fmt: skip
            print("validate", name, dk, out[f"{name}_dk{dk}"], flush=True)
    return out


def run(out_path: Path, *, device: str, seeds: list[int], examples: int, budget_s: float,
        write: Callable[[Path, dict[str, Any]], None] | None = None,
        counterexample_only: bool = False,
        conformance_schemes: tuple[str, ...] = ("backend",)) -> dict[str, Any]:  # fmt: skip
    """Every step on ``device`` (on the CPU steps 1 and 2; with ``counterexample_only`` step 1;
    step 2 with each of ``conformance_schemes``), ``OUT`` written after each."""
    from vla_verify.bench import machine_info

    write = write or (lambda p, d: p.write_text(json.dumps(d, indent=1)))
    deadline = time.time() + budget_s
    res: dict[str, Any] = {"machine": machine_info(), "device": device}
    res["counterexample"] = counterexample(device)
    print("counterexample", res["counterexample"], flush=True)
    write(out_path, res)
    if counterexample_only:
        return res
    res["conformance"] = {}
    for name in conformance_schemes:
        with scheme(name):
            res["conformance"][name] = conformance_rows(seeds, deadline)
        write(out_path, res)
    if device == "cpu":
        return res
    res["validate"] = validate_rows(examples, device, deadline)
    write(out_path, res)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4, 5])
    ap.add_argument("--examples", type=int, default=6)
    ap.add_argument("--budget-s", type=float, default=400.0,
                    help="start no step after this many seconds")  # fmt: skip
    ap.add_argument("--counterexample-only", action="store_true", help="step 1 only")
    ap.add_argument("--conformance-schemes", nargs="+", choices=SCHEMES, default=["backend"],
                    help="the schemes of step 2 (default: the backend's)")  # fmt: skip
    a = ap.parse_args()
    run(a.out, device=a.device, seeds=a.seeds, examples=a.examples, budget_s=a.budget_s,
        counterexample_only=a.counterexample_only,
        conformance_schemes=tuple(a.conformance_schemes))  # fmt: skip


if __name__ == "__main__":
    main()
