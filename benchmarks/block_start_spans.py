"""The float64 products-only block starts over long sequences, on the CPU under Triton's
interpreter: the evidence for ``PRODUCTS_ONLY_SPAN_PER_KEY`` in
``vla_verify/backends/triton_chunked.py``.

For the layer's penalties (``‖u‖² = 1/dk``, random directions; paper preset, one head, 32
blocks of ``T/32`` tokens, as the forward blocks long sequences), the largest relative error of
:func:`~vla_verify.backends.triton_chunked.penalty_block_starts` with ``normalise=False``
against the normalised starts (one solve per block), with the products applied over the whole
sequence (``one_span``) and in the backend's spans of ``PRODUCTS_ONLY_SPAN_PER_KEY · dk``
tokens (``spans``); the forward's block-end check fails past ``BLOCK_START_RTOL``.
``--forward TxDK`` also runs the chunked forward end to end (float32 inputs, one head, the same
penalties and blocks, positive queries and keys) both ways: its block-start fallbacks (the
sequential second pass), ``o``'s largest error relative to the float64 oracle's largest
``|o|`` and the interpreter's seconds.  Usage::

    TRITON_INTERPRET=1 python benchmarks/block_start_spans.py \
        --json benchmarks/results/cpu/block_start_spans.json --forward 32768x8
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vla_verify.backends import triton_chunked as tc

#: (dk, lengths): each width up to the first length whose one span fails the check.
CASES = ((4, (8192, 32768)), (8, (8192, 32768)), (16, (8192, 16384, 32768, 65536)),
         (32, (16384, 32768, 65536)), (64, (32768, 65536, 131072)), (128, (65536,)))  # fmt: skip


def layer_penalties(
    T: int, dk: int, seed: int = 0, rng: np.random.Generator | None = None
) -> torch.Tensor:
    """``u`` ``[1, T, dk]`` float64: random projections of Gaussian keys, normalised to
    ``‖u‖² = 1/dk`` (spec §2.1); drawn from ``rng`` where given, else from ``seed``."""
    rng = np.random.default_rng(seed) if rng is None else rng
    p = rng.standard_normal((T, dk)) @ (rng.standard_normal((dk, dk)) / np.sqrt(dk)).T
    return torch.tensor(p / np.linalg.norm(p, axis=1, keepdims=True) / np.sqrt(dk))[None]


def relative_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """The largest ``max|got − ref| / max|ref|`` over the blocks (inf where not finite)."""
    if not torch.isfinite(got).all():
        return float("inf")
    return float(((got - ref).abs().amax(dim=(-2, -1)) / ref.abs().amax(dim=(-2, -1))).max())


def case(T: int, dk: int) -> dict[str, Any]:
    block = T // 32
    u = layer_penalties(T, dk)
    A0 = torch.eye(dk, dtype=torch.float64)[None] / 0.1
    walk = dict(start=0, nudge_period=20, nudge_eta=1e-3, block=block)
    matrices = tc._block_matrices_by_trees(u, 0, 20, 1e-3, block)
    ref = tc.penalty_block_starts(None, A0, normalise=True, matrices=matrices, **walk)
    row: dict[str, Any] = {"dk": dk, "T": T, "block": block,
                           "span": tc.PRODUCTS_ONLY_SPAN_PER_KEY * dk}  # fmt: skip
    row["spans"] = relative_error(
        tc.penalty_block_starts(None, A0, normalise=False, matrices=matrices, **walk), ref
    )
    shipped = tc.PRODUCTS_ONLY_SPAN_PER_KEY
    tc.PRODUCTS_ONLY_SPAN_PER_KEY = T  # one span: the whole sequence
    try:
        row["one_span"] = relative_error(
            tc.penalty_block_starts(None, A0, normalise=False, matrices=matrices, **walk), ref
        )
    finally:
        tc.PRODUCTS_ONLY_SPAN_PER_KEY = shipped
    return row


def forward(T: int, dk: int) -> list[dict[str, Any]]:
    """The chunked forward in spans and in one span (module docstring)."""
    from vla_verify import VLAConfig
    from vla_verify.backends.numpy_oracle import recurrence

    rng = np.random.default_rng(1)
    u = layer_penalties(T, dk)[:, :, None].float()
    q, k = (torch.tensor(np.exp(0.5 * rng.standard_normal((1, T, 1, dk))), dtype=torch.float32)
            for _ in range(2))  # fmt: skip
    v = torch.tensor(rng.standard_normal((1, T, 1, dk)), dtype=torch.float32)
    config = VLAConfig()
    ref = recurrence(*(x.double().numpy() for x in (q, k, v, u)), config=config).o
    rows = []
    shipped = tc.PRODUCTS_ONLY_SPAN_PER_KEY
    for name, span in (("spans", shipped), ("one_span", T)):
        tc.PRODUCTS_ONLY_SPAN_PER_KEY = span
        before, t0 = tc.BLOCK_START_FALLBACKS[0], time.perf_counter()
        try:
            o = tc.chunked_vla(q, k, v, u, config=config, penalty_block=T // 32)[0]
        finally:
            tc.PRODUCTS_ONLY_SPAN_PER_KEY = shipped
        rows.append({"T": T, "dk": dk, "block": T // 32, "starts": name,
                     "fallbacks": tc.BLOCK_START_FALLBACKS[0] - before,
                     "o_relative_error": float(np.abs(o.double().numpy() - ref).max()
                                               / np.abs(ref).max()),
                     "seconds": round(time.perf_counter() - t0, 1)})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--forward", nargs="*", default=[], metavar="TxDK")
    a = ap.parse_args()
    t0 = time.perf_counter()
    rows = []
    for dk, lengths in CASES:
        for T in lengths:
            rows.append(case(T, dk))
            print(json.dumps(rows[-1]), flush=True)
    forwards = [r for f in a.forward for r in forward(*(int(n) for n in f.split("x")))]
    out = {"command": "TRITON_INTERPRET=1 python benchmarks/block_start_spans.py --json OUT "
                      + " ".join(["--forward", *a.forward] if a.forward else []),
           "block_start_rtol": tc.BLOCK_START_RTOL, "rows": rows, "forward": forwards,
           "seconds": round(time.perf_counter() - t0, 1)}  # fmt: skip
    a.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
