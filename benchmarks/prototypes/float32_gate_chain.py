"""The chunked forward's gates by the per-token Sherman–Morrison chain in float32, restarted at
every block start, for its precision (not a backend; ``docs/design/triton_chunked.md``, "The
floor", further way 5).

``triton_chunked`` forms the gates ``α̂`` by a float64 Woodbury chain over chunks of 16 tokens,
in parallel blocks from their start penalties (the blocks' matrices, the starts' products and
one batched solve, in float64).  The recurrent kernel's gate pass forms them token by token in
float32 (``vla_gate_kernel``, which the backward already runs from every checkpoint in
parallel).  Run from the same block starts, rounded to float32, it would replace the float64
chain.  Before its speed, its precision: this module takes the gates of each block from the
NumPy oracle run in float32 (every operation rounded to float32) from that block's start, the
start being

- ``exact``: the float64 oracle's own ``A`` at the block's start, rounded to float32;
- ``products``: what the forward computes, :func:`penalty_block_starts` with
  ``normalise=False`` (the blocks' matrices applied block after block, one solve), rounded;
- ``planted_A0``: every block from ``A_0``, the history of the earlier blocks lost (a planted
  fault that the comparison must reject);

and also ``one_block`` (the float32 oracle's gates through the whole sequence, as the
recurrent kernel forms them) and ``exact_gates`` (the float64 oracle's).  Each set of gates
goes through spec §5's state side (``bf16_state_side.state_side``: for float32 inputs float32
storage and products, for bf16 inputs bf16 ones, as ``triton_chunked`` keeps them in
inference), and ``o`` and the last ``S`` are compared with the spec §4 budget of the inputs'
dtype (the float64 oracle against the oracle run in that dtype; ``terms = dk + C``).

``python benchmarks/prototypes/float32_gate_chain.py OUT`` runs layer-like, concentrated and
strong Gaussian penalties (B = 1, H = 2, dk = dv = 64, T = 1024, blocks of 128 tokens, C = 64,
paper preset, three seeds each, float32 and bf16 inputs) and writes
``OUT/float32_gate_chain.json``, with the largest relative error of the ``products`` starts
against the exact ones and, per kind of start, the largest relative difference between a
block's end by the float32 chain and the next block's start.  It runs Triton's interpreter
for the starts' kernel (``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bf16_state_side as proto

from vla_verify import VLAConfig
from vla_verify.backends.numpy_oracle import recurrence
from vla_verify.error_model import compare

STARTS = ("exact", "products", "planted_A0")
#: (storage, product) of the state side per input dtype, as the kernel keeps them in inference.
STATE_SIDE = {"float32": ("float32", "float32"), "bfloat16": ("bf16", "bf16")}


def block_starts(
    seen: list[np.ndarray], config: VLAConfig, block: int, how: str, ref_A: np.ndarray
) -> np.ndarray:
    """``A`` at every block's start ``[B, NB, H, dk, dk]`` float64, by ``how`` (:data:`STARTS`);
    ``ref_A`` is the float64 oracle's ``A`` after every token ``[B, T, H, dk, dk]``."""
    B, T, H, dk = seen[0].shape
    NB = -(-T // block)
    A0 = np.broadcast_to(np.eye(dk) / config.lambda0, (B, H, dk, dk))
    if how == "planted_A0":
        return np.repeat(A0[:, None], NB, axis=1)
    if how == "exact":
        later = ref_A[:, block - 1 : (NB - 1) * block : block]
        return np.concatenate([A0[:, None], later], axis=1)
    from vla_verify.backends.triton_chunked import penalty_block_starts

    u = torch.tensor(seen[3]).permute(0, 2, 1, 3).reshape(B * H, T, dk)
    A0t = torch.tensor(np.ascontiguousarray(A0)).reshape(B * H, dk, dk)
    period = config.nudge_period
    starts = penalty_block_starts(
        u, A0t, start=0, nudge_period=None if period is None else int(period),
        nudge_eta=config.nudge_eta, block=block, normalise=False,
    )  # fmt: skip
    return starts.reshape(B, H, NB, dk, dk).permute(0, 2, 1, 3, 4).numpy()


def chain_gates(
    seen: list[np.ndarray], config: VLAConfig, block: int, starts: np.ndarray, dtype: str
) -> tuple[np.ndarray, float]:
    """The gates ``[B, T, H, dk]``: each block's from the oracle run in ``dtype`` from its
    start (rounded to ``dtype``), its nudge clock at the block's first token; and the largest
    relative difference between a block's end so and the next block's start (what a block-end
    check on this chain would see)."""
    q, k, v, u = seen
    B, T, H, dk = q.shape
    gates = np.empty_like(q)
    end_error = 0.0
    for nb, t0 in enumerate(range(0, T, block)):
        sl = slice(t0, min(T, t0 + block))
        A = starts[:, nb].astype(np.float32).astype(np.float64)
        state = (np.zeros((B, H, v.shape[-1], dk)), A, np.ones((B, H, dk)))
        res = recurrence(q[:, sl], k[:, sl], v[:, sl], u[:, sl], config=config,
                         initial_state=state, dtype=dtype, return_states=True,
                         start=t0)  # fmt: skip
        assert res.history is not None
        gates[:, sl] = res.history.gate
        if nb + 1 < starts.shape[1]:
            nxt = starts[:, nb + 1]
            scale = np.abs(nxt).max(axis=(-2, -1), keepdims=True)
            end_error = max(end_error, float((np.abs(res.state[1] - nxt) / scale).max()))
    return gates, end_error


def ratios(
    x: list[np.ndarray], config: VLAConfig, block: int, C: int, dtype: str
) -> dict[str, Any]:
    """Each variant's worst error / budget for ``o`` and the last ``S`` (module docstring), on
    the inputs rounded to ``dtype``, and the ``products`` starts' largest relative error.  Where
    the oracle run in ``dtype`` is not finite there is no budget (ValueError)."""
    tdt = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    t = [torch.tensor(a).to(tdt) for a in x]
    seen = [a.double().numpy() for a in t]
    ref = recurrence(*seen, config=config, return_states=True)
    base = recurrence(*seen, config=config, dtype=dtype, return_states=True)
    if not (np.isfinite(base.o).all() and np.isfinite(base.state[0]).all()):
        raise ValueError(f"the oracle run in {dtype} is not finite here: spec §4 sets no budget")
    assert ref.history is not None and base.history is not None
    gates: dict[str, np.ndarray] = {"exact_gates": ref.history.gate,
                                    "one_block": base.history.gate}  # fmt: skip
    starts = {how: block_starts(seen, config, block, how, ref.history.A) for how in STARTS}
    end_errors = {}
    for how, A in starts.items():
        gates[how], end_errors[how] = chain_gates(seen, config, block, A, "float32")
    exact = starts["exact"]
    scale = np.abs(exact).max(axis=(-2, -1), keepdims=True)
    start_error = float((np.abs(starts["products"] - exact) / scale).max())
    q, k, v = (a.float() for a in t[:3])
    storage, product = STATE_SIDE[dtype]
    dk = x[0].shape[-1]
    out: dict[str, Any] = {"products_start_relative_error": start_error,
                           "block_end_relative_difference": end_errors}  # fmt: skip
    for name, g in gates.items():
        o, S = proto.state_side(q, k, v, torch.tensor(g, dtype=torch.float32), C=C,
                                storage=storage, product=product, config=config)  # fmt: skip
        got = {"o": (o, ref.o, base.o), "S": (S, ref.state[0], base.state[0])}
        out[name] = {key: compare(key, g_.double().numpy(), r, b, dtype, terms=dk + C).ratio
                     for key, (g_, r, b) in got.items()}  # fmt: skip
    return out


def main(out: Path) -> None:
    config = VLAConfig()
    rows = []
    t0 = time.perf_counter()
    for dtype in ("float32", "bfloat16"):
        for penalties in ("layer", "concentrated", "gaussian"):
            for seed in range(3):
                row: dict[str, Any] = {"dtype": dtype, "penalties": penalties, "seed": seed}
                try:
                    row["ratios"] = ratios(proto.inputs(1024, 64, 64, penalties, seed), config,
                                           128, 64, dtype)  # fmt: skip
                except ValueError as exc:
                    row["ratios"], row["reason"] = None, str(exc)
                rows.append(row)
                print(json.dumps(row), flush=True)
    names = ("exact_gates", "one_block", *STARTS)
    worst: dict[str, Any] = {}
    for dtype in ("float32", "bfloat16"):
        judged = [r["ratios"] for r in rows if r["ratios"] is not None and r["dtype"] == dtype]
        worst[dtype] = {n: {key: max(r[n][key] for r in judged) for key in ("o", "S")}
                        for n in names}  # fmt: skip
        worst[dtype]["products_start_relative_error"] = max(
            r["products_start_relative_error"] for r in judged
        )
        worst[dtype]["block_end_relative_difference"] = {
            how: max(r["block_end_relative_difference"][how] for r in judged) for how in STARTS
        }
    proto.write_study(out / "float32_gate_chain.json", {
        "command": "TRITON_INTERPRET=1 python benchmarks/prototypes/float32_gate_chain.py OUT",
        "settings": dict(B=1, H=2, dk=64, dv=64, T=1024, block=128, C=64, preset="paper"),
    }, rows, worst, t0)  # fmt: skip


if __name__ == "__main__":
    main(Path(sys.argv[1]))
