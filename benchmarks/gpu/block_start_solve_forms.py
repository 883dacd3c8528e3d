"""The block starts' solve ``A = Π Θ^{-1}`` in other forms, side by side with the LU
(cuBLAS's batched LU with partial pivoting and two triangular solves), alone and in the whole
forward.

The backend's ``_solve_block_starts`` takes both: the LU for the float64 chain, and for the
float32 chain (the bf16 inference forward) the Cholesky form of
``benchmarks/prototypes/block_start_inverse_forms.py``: ``S = Θᵀ Π`` is symmetric positive
definite, so ``A = W Wᵀ`` with ``W = Π L^{-T}``, ``S = L Lᵀ``: one factorisation without a
pivot search and one triangular solve where the LU takes two, and ``A`` symmetric by
construction.  Forming ``S`` squares ``Θ``'s condition number in its rounding: on the layer's
penalties its starts err by 1e-14 to 1e-10 where the LU's err by 1e-14 to 1e-12
(``benchmarks/results/cpu/block_start_inverse_forms.json``), far inside the float32 chain's
check.  The rows here are the LU (``lu``, the reference) and each form given (default: the
Cholesky form, ``cholesky``), each put in place of the backend's solve.

Correctness first: every form's starts against the LU's (largest entry difference over the
largest entry, within :func:`agree_rtol`, a tenth of the float32 chain's block-end check), then
the forward with each form in place against the forward with the LU (its output within
``OUTPUT_RTOL``, and no block-start fallback), then ``validate`` (spec §4, bf16, paper preset,
every example at the row's key width) of the backend with each form in place and blocks of
``VALIDATE_BLOCK`` tokens, so that its examples of up to 640 tokens run the form's starts; then,
for the forms that pass all three, each solve's median on the forward's own ``(Π; Θ)``
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
import math
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

#: The share of the float32 chain's block-end check (``block · 2^-24`` relative, the only chain
#: that takes the Cholesky form) that a form's starts may differ from the LU's by: a tenth, as
#: the backend's test asks of the Cholesky starts over 32768 tokens.  The form errs by up to
#: about 1e-10 on the layer's penalties on the CPU
#: (``benchmarks/results/cpu/block_start_inverse_forms.json``) and by 1.4e-8 to 1.8e-8 from the
#: LU's on an H100 (``h100/block_start_solve_forms_d1fb5ec.json``); the check at blocks of 512
#: tokens is 3.1e-5.
AGREE_SHARE = 0.1
#: The forward's ``o`` with a form in place against the LU forward's (largest difference over
#: the largest entry): one bf16 rounding, ``2^-8``.  Starts that differ by far less than the float32
#: chain's rounding can still move a bf16 output across a rounding boundary, by one unit.
OUTPUT_RTOL = 2.0**-8
#: The blocks' length under ``validate``, the penalty chain's chunk: its examples (up to 640
#: tokens, most of them short) otherwise run as one block, with no start solved; with blocks
#: of 64 tokens three examples at each width solved none on an H100
#: (``h100/block_start_solve_forms_float32_gate_0dc9f85.json``'s note).
VALIDATE_BLOCK = 16


def agree_rtol(block_tokens: int) -> float:
    """The largest start difference from the LU's that a form may show at blocks of
    ``block_tokens`` tokens: :data:`AGREE_SHARE` of the float32 chain's check."""
    from vla_verify.backends.triton_chunked import FLOAT32_CHAIN_RTOL_PER_TOKEN

    return AGREE_SHARE * block_tokens * FLOAT32_CHAIN_RTOL_PER_TOKEN


def solve_lu(XX: Any) -> Any:
    """``[BH, NB, dk, dk]`` float64 starts from ``XX`` ``[NB, BH, 2dk, dk]`` (``(Π; Θ)`` at
    every block start) by the backend's LU."""
    from vla_verify.backends.triton_chunked import _solve_block_starts

    return _solve_block_starts(XX, cholesky=False)


def solve_cholesky(XX: Any) -> Any:
    """The same starts by the backend's Cholesky form (module docstring)."""
    from vla_verify.backends.triton_chunked import _solve_block_starts

    return _solve_block_starts(XX, cholesky=True)


@contextlib.contextmanager
def solved_by(form: Callable[[Any], Any]) -> Iterator[list[Any]]:
    """The backend with its block starts solved by ``form`` whatever its chain, recording the
    ``(Π; Θ)`` it solves."""
    from vla_verify.backends import triton_chunked as tc

    real = tc._solve_block_starts
    seen: list[Any] = []

    def solve(XX: Any, *rest: Any) -> Any:
        seen.append(XX)
        tc._solve_block_starts = real  # the forms call the backend's own solve
        try:
            return form(XX)
        finally:
            tc._solve_block_starts = solve

    tc._solve_block_starts = solve
    try:
        yield seen
    finally:
        tc._solve_block_starts = real


def _relative(a: Any, b: Any) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def validate_patched(
    form: Callable[[Any], Any], D: int, device: str, smoke: bool, examples: int
) -> dict[str, Any]:
    """``validate`` of the backend with its block starts solved by ``form``, in blocks of
    :data:`VALIDATE_BLOCK` tokens, every example's heads ``D`` wide: passed, the starts solved
    (``solves``, which must not be 0) and the block-end check's fallbacks (a fallback reruns
    the chain in one block, exact by construction, and would hide a wrong form: none
    allowed)."""
    from vla_verify import VLAConfig, backends, validate
    from vla_verify.backends import triton_chunked as tc

    be = backends.get("triton_chunked", penalty_block=VALIDATE_BLOCK)
    # The interpreter's bf16 products are wrong (its smoke run takes float32 and short lengths).
    sizes: dict[str, Any] = {"max_T": 70, "max_batch": 2} if smoke else {}
    before = tc.BLOCK_START_FALLBACKS[0]
    with solved_by(form) as seen:
        rep = validate(be, config=VLAConfig(), array="torch", device=device, seed=D,
                       dtype="float32" if smoke else "bfloat16", head_dims=(D,),
                       max_examples=examples, **sizes)  # fmt: skip
    return {"passed": rep.passed, "examples": rep.examples, "worst_ratio": rep.worst_ratio,
            "solves": len(seen), "fallbacks": tc.BLOCK_START_FALLBACKS[0] - before,
            "summary": "" if rep.passed else rep.summary()[:800]}  # fmt: skip


def row(
    D: int,
    T: int,
    device: str,
    smoke: bool,
    forms: dict[str, Callable[[Any], Any]] | None = None,
    examples: int = 6,
) -> dict[str, Any]:
    """The backend's LU and each of ``forms`` (default: the Cholesky form) at ``D × T``; each
    form's ``validate`` at ``examples`` examples."""
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
    every: dict[str, Callable[[Any], Any]] = {"lu": solve_lu}
    every.update(forms if forms is not None else {"cholesky": solve_cholesky})
    with solved_by(solve_lu) as seen:
        o_lu = forward()
    XX = seen[-1]
    A_lu = solve_lu(XX)
    out["blocks"], out["heads"] = XX.shape[0], XX.shape[1]
    out["agree_rtol"] = agree_rtol(math.ceil(T / XX.shape[0]))
    for name, form in every.items():
        rec: dict[str, Any] = {}
        solver = functools.partial(form, XX)
        if name != "lu":
            rec["starts_relative_to_lu"] = _relative(form(XX), A_lu)
        before = tc.BLOCK_START_FALLBACKS[0]
        with solved_by(form):
            o = forward()
            rec["o_relative_to_lu"] = _relative(o.double(), o_lu.double())
            rec["block_start_fallbacks"] = tc.BLOCK_START_FALLBACKS[0] - before
            rec["agrees"] = (rec.get("starts_relative_to_lu", 0.0) <= out["agree_rtol"]
                             and rec["o_relative_to_lu"] <= OUTPUT_RTOL
                             and rec["block_start_fallbacks"] == 0)  # fmt: skip
        if name != "lu" and rec["agrees"]:
            rec["validate"] = v = validate_patched(form, D, device, smoke, examples)
            rec["agrees"] = v["passed"] and v["solves"] > 0 and v["fallbacks"] == 0
        with solved_by(form):
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
    ap.add_argument(
        "--examples", type=int, default=6, help="validate's examples per form (default: 6)"
    )
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
        res["rows"].append(row(D, T, "cpu" if a.smoke else "cuda", a.smoke, examples=a.examples))
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
