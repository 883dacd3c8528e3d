"""The float32 gate chain prototype (``benchmarks/prototypes/float32_gate_chain.py``): its block
starts are the oracle's (a known answer), its ``products`` starts are the forward's to float64
rounding, and the spec §4 comparison it reports can fail: blocks that all start from ``A_0``
fall outside the budget where the float32 chain from the true starts stays inside."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vla_verify.backends.triton_chunked")

from vla_verify import VLAConfig  # noqa: E402
from vla_verify.backends.numpy_oracle import recurrence  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "prototypes"))
import bf16_state_side as proto  # noqa: E402
import float32_gate_chain as chain  # noqa: E402

PAPER = VLAConfig()


def test_the_chain_from_exact_starts_in_float64_is_the_oracle() -> None:
    """Known answer: each block from the oracle's own ``A`` at its start, in float64, with its
    nudge clock at its first token (blocks of 48, nudges every 20: starts at three phases)."""
    x = proto.inputs(150, 8, 6, "layer", 2)
    ref = recurrence(*x, config=PAPER, return_states=True)
    starts = chain.block_starts(x, PAPER, 48, "exact", ref.history.A)
    B, T, H, dk = x[0].shape
    gates = np.empty_like(x[0])
    for nb, t0 in enumerate(range(0, T, 48)):
        sl = slice(t0, min(T, t0 + 48))
        state = (np.zeros((B, H, 6, dk)), starts[:, nb], np.ones((B, H, dk)))
        res = recurrence(*(a[:, sl] for a in x), config=PAPER, initial_state=state,
                         return_states=True, start=t0)  # fmt: skip
        gates[:, sl] = res.history.gate
    assert np.abs(gates - ref.history.gate).max() < 1e-12


@pytest.mark.triton
def test_products_starts_are_the_exact_ones() -> None:
    x = proto.inputs(150, 8, 6, "concentrated", 1)
    ref = recurrence(*x, config=PAPER, return_states=True)
    exact = chain.block_starts(x, PAPER, 48, "exact", ref.history.A)
    products = chain.block_starts(x, PAPER, 48, "products", ref.history.A)
    assert np.abs(products - exact).max() < 1e-12 * np.abs(exact).max()


@pytest.mark.triton
@pytest.mark.parametrize("penalties", ["layer", "gaussian"])
def test_the_budget_separates_true_starts_from_planted_ones(penalties: str) -> None:
    r = chain.ratios(proto.inputs(256, 16, 16, penalties, 0), PAPER, 64, 64, "float32")
    for name in ("exact_gates", "one_block", "exact", "products"):
        assert max(r[name].values()) <= 1, (name, r[name])
    assert max(r["planted_A0"].values()) > 1
    # A block's end by the float32 chain and the next block's start: within 16·L·2^-24 for
    # blocks of L = 64 tokens from the true starts, far outside it from the planted ones.
    ends = r["block_end_relative_difference"]
    bound = 16 * 64 * 2.0**-24
    assert ends["exact"] < bound and ends["products"] < bound < ends["planted_A0"]


@pytest.mark.triton
def test_the_gate_pass_from_block_starts_gives_the_chunked_gates(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``benchmarks/gpu/gate_chain_blocks.py``'s gates (the recurrent kernel's float32 gate pass
    folded into three blocks, each from its float64 start rounded to float32) equal the chunked
    forward's float64 chain's to float32 rounding; with every block started from ``A_0`` they
    do not."""
    from vla_verify.backends import triton_chunked as tc
    from vla_verify.bench import _inputs

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "gpu"))
    import gate_chain_blocks as blocks

    x = _inputs(1, 96, 2, 16, torch.float32, "cpu")
    q, k, v, u = (x[n] for n in "qkvu")
    ref = blocks.chunked_gates(q, k, v, u, PAPER, 32)

    def difference() -> float:
        got = blocks.block_gates(q, k, u, PAPER, 32)
        w = min(ref.shape[-1], got.shape[-1])
        return float((got[..., :w] - ref[..., :w]).abs().max() / ref[..., :w].abs().max())

    # A float32 chain of at most 96 steps from a start rounded to float32: about 96·2^-24
    # relative, far below 1e-5; the planted starts are off by the blocks' own history.
    assert difference() < 1e-5
    real = tc.penalty_block_starts
    monkeypatch.setattr(tc, "penalty_block_starts",
                        lambda *a, **kw: real(*a, **kw)[:, :1].expand(-1, 3, -1, -1))  # fmt: skip
    assert difference() > 1e-2
