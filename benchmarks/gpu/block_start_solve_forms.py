"""The block starts' solve ``A = Π Θ^{-1}`` in another form, side by side with the backend's
(cuBLAS's batched LU with partial pivoting and two triangular solves,
``triton_chunked._solve_block_starts``), alone and in the whole forward.

The other form is the Cholesky one of ``benchmarks/prototypes/block_start_inverse_forms.py``:
``S = Θᵀ Π`` is symmetric positive definite, so ``A = W Wᵀ`` with ``W = Π L^{-T}``,
``S = L Lᵀ``: one factorisation without a pivot search and one triangular solve where the LU
takes two, and ``A`` symmetric by construction.  Forming ``S`` squares ``Θ``'s condition
number in its rounding: on the layer's penalties its starts err by 1e-14 to 1e-10 where the
LU's err by 1e-14 to 1e-12 (``benchmarks/results/cpu/block_start_inverse_forms.json``), far
inside the float32 chain's check, so ``benchmarks/prototypes/cholesky_block_starts.patch``
gives it to the float32 chain alone.  Run this script on the tree without the patch.

Correctness first: every form's starts against the LU's (largest entry difference over the
largest entry, within ``AGREE_RTOL``), then the forward with each form patched in against the
backend's forward (its output, and no block-start fallback); then, for the forms that agree,
each solve's median on the forward's own ``(Π; Θ)``
and each forward's median and device time (``vla_verify.bench.time_ms``, the lower of two)::

    python benchmarks/gpu/block_start_solve_forms.py OUT.json [--sizes 64x16384 128x16384]

B = 1, H = 16, bf16, paper preset (the inference forward and its float32 chain).  ``--smoke``
runs toy sizes on the CPU under ``TRITON_INTERPRET=1`` (correctness only, no timing).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

#: A form agrees with the LU where its starts differ by at most this (largest entry difference
#: over the largest entry): the float64 chain's block-end check (``BLOCK_START_RTOL``), far
#: tighter than the float32 chain's that the bf16 forward runs (``block · 2^-24``).  The
#: Cholesky form errs by up to about 1e-10 on the layer's penalties
#: (``benchmarks/results/cpu/block_start_inverse_forms.json``, and the interpreter test of
#: long products-only spans).  A form that does not agree, or whose forward falls back to its
#: second pass, is not timed.
AGREE_RTOL = 1e-9


def solve_cholesky(XX: Any) -> Any:
    """``[BH, NB, dk, dk]`` float64 starts from ``XX`` ``[NB, BH, 2dk, dk]`` (``(Π; Θ)`` at
    every block start) by the Cholesky form (module docstring).  No factor's info is read
    back: a factor that does not exist gives wrong starts, which the block-end check rejects."""
    import torch

    from vla_verify.backends.triton_chunked import _batched_cublas_lu

    NB, BH, _, dk = XX.shape
    X3 = XX.reshape(NB * BH, 2 * dk, dk)
    Pi, Th = X3[:, :dk], X3[:, dk:]
    # The factorisation reads the lower triangle of S alone: no symmetrisation first.
    S = torch.bmm(Th.mT, Pi)
    with _batched_cublas_lu(XX.device):
        L = torch.linalg.cholesky_ex(S)[0]
        W = torch.linalg.solve_triangular(L.mT, Pi, upper=True, left=False)  # Π L^{-T}
    return torch.bmm(W, W.mT).view(NB, BH, dk, dk).transpose(0, 1)


@contextlib.contextmanager
def solved_by(form: Callable[[Any], Any] | None) -> Iterator[list[Any]]:
    """The backend with its block starts solved by ``form`` (``None``: its own), recording the
    ``(Π; Θ)`` it solves."""
    from vla_verify.backends import triton_chunked as tc

    real = tc._solve_block_starts
    seen: list[Any] = []

    def solve(XX: Any, *rest: Any) -> Any:
        seen.append(XX)
        return form(XX) if form is not None else real(XX, *rest)

    tc._solve_block_starts = solve
    try:
        yield seen
    finally:
        tc._solve_block_starts = real


def _relative(a: Any, b: Any) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def row(
    D: int, T: int, device: str, smoke: bool, forms: dict[str, Callable[[Any], Any]] | None = None
) -> dict[str, Any]:
    """The backend's LU and each of ``forms`` (default: the Cholesky form) at ``D × T``."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from vla_verify import VLAConfig
    from vla_verify.backends import triton_chunked as tc
    from vla_verify.bench import _inputs, time_ms

    cfg = VLAConfig()
    x = _inputs(1, T, 2 if smoke else 16, D, torch.float32 if smoke else torch.bfloat16, device)
    args = [x[n] for n in "qkvu"]
    block = 32 if smoke else None

    def forward() -> Any:
        return tc.chunked_vla(*args, config=cfg, penalty_block=block)[0]

    out: dict[str, Any] = {"D": D, "T": T}
    every: dict[str, Callable[[Any], Any] | None] = {"lu": None}
    every.update(forms if forms is not None else {"cholesky": solve_cholesky})
    with solved_by(None) as seen:
        o_lu = forward()
    XX = seen[-1]
    A_lu = tc._solve_block_starts(XX)
    out["blocks"], out["heads"] = XX.shape[0], XX.shape[1]
    for name, form in every.items():
        rec: dict[str, Any] = {}
        solver = functools.partial(form or tc._solve_block_starts, XX)
        if form is not None:
            rec["starts_relative_to_lu"] = _relative(form(XX), A_lu)
        before = tc.BLOCK_START_FALLBACKS[0]
        with solved_by(form):
            o = forward()
            rec["o_relative_to_lu"] = _relative(o.double(), o_lu.double())
            rec["block_start_fallbacks"] = tc.BLOCK_START_FALLBACKS[0] - before
            rec["agrees"] = (rec.get("starts_relative_to_lu", 0.0) <= AGREE_RTOL
                             and rec["block_start_fallbacks"] == 0)  # fmt: skip
            if rec["agrees"] and not smoke:
                rec["solve_ms"] = min(time_ms(solver), time_ms(solver))
                rec["fwd_ms"] = min(time_ms(forward), time_ms(forward))
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(5):
                        forward()
                    torch.cuda.synchronize()
                rec["fwd_device_ms"] = (
                    sum(e.device_time_total for e in prof.key_averages() if e.device_time_total > 0)
                    / 5e3
                )
        out[name] = rec
        print(D, T, name, json.dumps(rec), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--sizes", nargs="+", default=["64x16384", "128x16384"])
    ap.add_argument("--smoke", action="store_true", help="toy sizes on the CPU interpreter")
    a = ap.parse_args()
    if a.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
        a.sizes = ["16x96"]
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from vla_verify.bench import machine_info

    res: dict[str, Any] = {"machine": machine_info(), "rows": [],
                           "command": "python benchmarks/gpu/block_start_solve_forms.py OUT.json "
                           + " ".join(["--sizes", *a.sizes])}  # fmt: skip
    for size in a.sizes:
        D, T = (int(s) for s in size.split("x"))
        res["rows"].append(row(D, T, "cpu" if a.smoke else "cuda", a.smoke))
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
