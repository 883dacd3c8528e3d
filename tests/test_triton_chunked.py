"""The Triton chunked backend ``triton_chunked`` (spec §5) under Triton's CPU interpreter.

Small shapes across chunk boundaries, against the float64 oracle within the spec §4 budget
(:func:`vla_verify.error_model.compare`, the chunked floor ``terms = dk + C``); planted bugs
must fall outside it.  The interpreter is slow (a few seconds per call at T ≈ 100), so the
examples are few and fixed.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from vla_verify import VLAConfig, backends  # noqa: E402
from vla_verify.backends.numpy_oracle import recurrence  # noqa: E402
from vla_verify.error_model import compare  # noqa: E402
from vla_verify.errors import NonFiniteError, UnsupportedConfigurationError  # noqa: E402

tc = pytest.importorskip("vla_verify.backends.triton_chunked")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from vla_verify.backends import triton_chunked_kernels as kernels  # noqa: E402

pytestmark = [
    pytest.mark.triton,
    pytest.mark.skipif(tc.availability_reason() is not None, reason=str(tc.availability_reason())),
    # CPU tensors: the interpreter's (tests/conftest.py sets it where no GPU is visible; on a GPU
    # run this module with TRITON_INTERPRET=1, tests/test_triton_chunked_gpu.py without).
    pytest.mark.skipif(not tc.interpreted(), reason="runs under TRITON_INTERPRET=1"),
]


def _inputs(T: int, dk: int, dv: int, H: int = 2, seed: int = 0, state: bool = False):
    """Layer-like float64 inputs (spec §2.5): positive q, k; ``||u||² = 1/dk``."""
    rng = np.random.default_rng(seed)
    q = np.exp(0.5 * rng.standard_normal((1, T, H, dk)))
    k = np.exp(0.5 * rng.standard_normal((1, T, H, dk)))
    v = rng.standard_normal((1, T, H, dv))
    u = rng.standard_normal((1, T, H, dk))
    u = u / np.linalg.norm(u, axis=-1, keepdims=True) / np.sqrt(dk)
    initial = None
    if state:
        G = rng.standard_normal((1, H, dk, dk))
        A = np.linalg.inv(0.1 * np.eye(dk) + G @ np.swapaxes(G, -1, -2))
        A = 0.5 * (A + np.swapaxes(A, -1, -2))
        initial = (rng.standard_normal((1, H, dv, dk)), A, 1 + rng.random((1, H, dk)))
    return [q, k, v, u], initial


def _outside_budget(
    fn, inputs, initial, config: VLAConfig, start: int, C: int, dtype=torch.float32
) -> list[str]:
    """Names of the outputs of ``fn`` outside the spec §4 budget against the float64 oracle
    (baseline: the oracle in float32, or bfloat16 for bfloat16 inputs)."""
    name = str(dtype).removeprefix("torch.")
    t = [torch.tensor(x, dtype=dtype) for x in inputs]
    state = None if initial is None else tuple(torch.tensor(x, dtype=dtype) for x in initial)
    o, got_state = fn(*t, config=config, initial_state=state, start=start)
    # The oracle sees the inputs as the kernel does (rounded to dtype).
    seen = [x.double().numpy() for x in t]
    seen_state = None if state is None else tuple(x.double().numpy() for x in state)
    ref = recurrence(*seen, config=config, initial_state=seen_state, start=start)
    base = recurrence(*seen, config=config, initial_state=seen_state, start=start, dtype=name)
    dk = inputs[0].shape[-1]
    A0_scale = 1 / config.lambda0 if initial is None else np.max(np.abs(initial[1]))
    bad = []
    got = dict(zip("oSAz", (o, *got_state), strict=True))
    refs = dict(zip("oSAz", (ref.o, *ref.state), strict=True))
    bases = dict(zip("oSAz", (base.o, *base.state), strict=True))
    for key, x in got.items():
        scale = None
        if key == "A":
            scale = np.maximum(np.max(np.abs(ref.state[1]), axis=(2, 3)), A0_scale)
        c = compare(key, x.double().numpy(), refs[key], bases[key], name, scale=scale, terms=dk + C)
        if not c.passed:
            bad.append(f"{key} ({c.ratio:.2f}x)")
    return bad


PAPER = VLAConfig()
STRONG_NUDGE = VLAConfig(nudge_period=20, nudge_eta=0.5)


@pytest.mark.parametrize(
    ("T", "dk", "dv", "C", "config", "start"),
    [
        (100, 16, 16, 64, PAPER, 0),
        (100, 32, 8, 32, STRONG_NUDGE, 7),
        (40, 8, 6, 16, VLAConfig.exact(), 0),
    ],
    ids=["paper-T100-C64", "nudge-start7-C32", "exact-T40-C16"],
)
def test_chunked_vla_matches_the_oracle(T, dk, dv, C, config, start) -> None:
    inputs, _ = _inputs(T, dk, dv, seed=T)
    fn = backends.get("triton_chunked", chunk_size=C)
    assert _outside_budget(fn, inputs, None, config, start, C) == []


def test_chunked_vla_initial_state_and_bfloat16() -> None:
    inputs, initial = _inputs(40, 8, 8, seed=5, state=True)
    fn = backends.get("triton_chunked", chunk_size=16)
    assert _outside_budget(fn, inputs, initial, STRONG_NUDGE, 13, 16) == []
    assert _outside_budget(fn, inputs, None, PAPER, 0, 16, torch.bfloat16) == []


def _in_two_calls(kernel, cut: int, carry: bool = True):
    """``kernel`` over the tokens before ``cut``, then over the rest from the float32 state the
    first call returned as it is (``carry=False``: from the first call's initial state, a
    planted lost carry)."""

    def run(q, k, v, u, *, config, initial_state=None, start=0):  # type: ignore[no-untyped-def]
        head = [x[:, :cut] for x in (q, k, v, u)]
        o1, state = kernel(*head, config=config, initial_state=initial_state, start=start)
        assert all(x.dtype == torch.float32 for x in state)
        tail = [x[:, cut:] for x in (q, k, v, u)]
        given = state if carry else initial_state
        o2, state = kernel(*tail, config=config, initial_state=given, start=start + cut)
        return torch.cat([o1, o2], dim=1), state

    return run


@pytest.mark.parametrize("kernel", ["chunked", "recurrent"])
def test_a_call_continues_from_the_float32_state_the_last_returned(kernel: str) -> None:
    """bf16 inputs, the state returned in float32 passed back as it is (the entry point's
    prefill then continuation): the two calls together within the spec §4 budget of one
    float64 oracle run over all tokens; the same check rejects a lost carry."""
    from vla_verify.backends.triton_fused import fused_recurrent_vla

    fn = tc.chunked_vla if kernel == "chunked" else fused_recurrent_vla
    inputs, _ = _inputs(50, 8, 8, seed=12)
    two_calls = _in_two_calls(fn, cut=23)
    assert _outside_budget(two_calls, inputs, None, STRONG_NUDGE, 3, 16, torch.bfloat16) == []
    lost = _in_two_calls(fn, cut=23, carry=False)
    assert _outside_budget(lost, inputs, None, STRONG_NUDGE, 3, 16, torch.bfloat16) != []


@pytest.mark.parametrize("width", [64, 128])
def test_wider_readout_value_blocks_give_the_same_output(monkeypatch, width: int) -> None:
    """``READOUT_VALUE_BLOCK`` (the read-out's value columns per program) changes which program
    forms which columns, not the values: the output equals the 32 columns' to the float32
    products' rounding, and meets the oracle's budget, across chunk boundaries (dv = 128, so
    32 columns run four programs per chunk and the widths one or two)."""
    inputs, _ = _inputs(70, 8, 128, H=1, seed=11)
    fn = backends.get("triton_chunked", chunk_size=32)
    t = [torch.tensor(x, dtype=torch.float32) for x in inputs]
    monkeypatch.setattr(tc, "READOUT_VALUE_BLOCK", {})
    o_default = fn(*t, config=PAPER)[0]
    monkeypatch.setattr(tc, "READOUT_VALUE_BLOCK", {128: width})
    o_wide = fn(*t, config=PAPER)[0]
    assert torch.allclose(o_wide, o_default, rtol=1e-5, atol=1e-6 * float(o_default.abs().max()))
    assert _outside_budget(fn, inputs, None, PAPER, 0, 32) == []


@pytest.mark.parametrize("bug", ["nudge_one_step_late", "read_before_write"])
def test_planted_bug_is_rejected(bug: str) -> None:
    """The same check fails each planted bug (so the test above can fail)."""
    inputs, _ = _inputs(45, 8, 6, seed=9)

    def planted(*args, **kwargs):
        return tc.chunked_vla(*args, chunk_size=16, planted_bug=bug, **kwargs)

    assert _outside_budget(planted, inputs, None, STRONG_NUDGE, 0, 16) != []


def test_gradients_match_torch_chunked_in_float64() -> None:
    """The backward (the recurrent kernels' adjoint, module docstring "Gradients"): the float32
    gradients are within the spec §4 budget of torch_chunked's float64 ones (``err_p``:
    torch_chunked's own float32 gradients, :func:`vla_verify.gradient_check.check_gradients`),
    strong nudges, the clock started at 5."""
    from vla_verify.backends.torch_chunked import chunked
    from vla_verify.gradient_check import check_gradients

    inputs, initial = _inputs(20, 4, 3, seed=3, state=True)
    rng = np.random.default_rng(4)
    cotangents = [rng.standard_normal(x.shape) for x in (inputs[2], *initial)]

    def torch_fn(*a, **kw):  # type: ignore[no-untyped-def]
        return chunked(*a, penalty_chain="woodbury", chunk_size=16, start=5, **kw)

    def triton_fn(*a, **kw):  # type: ignore[no-untyped-def]
        return tc.chunked_vla(*a, chunk_size=16, start=5, **kw)

    checks = check_gradients(
        triton_fn, torch_fn, [*inputs, *initial], cotangents, config=STRONG_NUDGE,
        dtype="float32", terms=inputs[0].shape[-1] + 16,
    )  # fmt: skip
    assert all(c.passed for c in checks.values()), {n: c.ratio for n, c in checks.items()}


def _gradients_outside_budget(inputs, initial, cotangents, start: int) -> list[str]:
    """Names of triton_chunked's float32 gradients of ``Σ ⟨cotangent, output⟩`` over
    ``o, S, A, z`` (in the inputs and the initial state) outside the spec §4 budget against
    torch_chunked's float64 ones on the float32 values the kernel received; paper preset,
    ``C = 16``, the floor's terms ``dk + C`` (:func:`vla_verify.gradient_check.check_gradients`).

    ``err_p`` is the float32 error of two other algorithms, torch_chunked's autograd and the
    recurrent kernel (``fused_recurrent_vla``), each against float64 on its own inputs, the
    largest over the received inputs and two copies moved by one unit in the last place.  The
    chunked backward is the recurrent adjoint started from the chunked forward's checkpoints, so
    a correct one errs like either, and a wrong one is O(1) off."""
    from vla_verify.backends.torch_chunked import chunked
    from vla_verify.gradient_check import check_gradients

    def torch_fn(*a, **kw):  # type: ignore[no-untyped-def]
        return chunked(*a, penalty_chain="woodbury", chunk_size=16, start=start, **kw)

    def fused_fn(*a, **kw):  # type: ignore[no-untyped-def]
        return tc.fused.fused_recurrent_vla(*a, start=start, **kw)

    def triton_fn(*a, **kw):  # type: ignore[no-untyped-def]
        return tc.chunked_vla(*a, chunk_size=16, start=start, **kw)

    checks = check_gradients(
        triton_fn, torch_fn, [*inputs, *initial], cotangents, config=PAPER, dtype="float32",
        baselines=[torch_fn, fused_fn], copies=2, terms=inputs[0].shape[-1] + 16,
    )  # fmt: skip
    return [f"{name} ({c.ratio:.2f}x)" for name, c in checks.items() if not c.passed]


def _state_gradient_case(T: int = 22):
    """``T`` tokens in chunks of 16, one head; ``start = 13``, so the paper preset's nudge
    (every 20 steps) fires after step 6 of the call, inside the first chunk; ``dk = dv``, so
    that a transposed ``S`` or ``dS`` still has the right shape; non-symmetric cotangents on
    ``S`` and ``A``.  From ``T = 65`` on, the backward reads checkpoints that the kernels
    store inside the sequence (every 64 tokens)."""
    inputs, initial = _inputs(T, 4, 4, H=1, seed=11, state=True)
    rng = np.random.default_rng(12)
    shapes = (inputs[2].shape, *(x.shape for x in initial))
    return inputs, initial, [rng.standard_normal(s) for s in shapes], 13


def test_gradients_with_initial_and_final_state() -> None:
    """Gradients in the initial ``(S, A, z)`` under cotangents on the final state, against
    torch_chunked in float64 (the recurrent adjoint takes the state in the spec §1 layouts, as
    the chunked forward returns it)."""
    assert _gradients_outside_budget(*_state_gradient_case()) == []


def test_gradients_across_checkpoints() -> None:
    """At T = 140 the backward starts its intervals from the A, S and z that the forward
    stored after 64 and 128 tokens."""
    assert _gradients_outside_budget(*_state_gradient_case(140)) == []


@pytest.mark.parametrize(
    ("bug", "T"),
    [("transposed_dS", 22), ("transposed_dA", 22), ("scaled_dq", 22),
     ("transposed_S_checkpoints", 70), ("shifted_A_checkpoints", 70)],
)  # fmt: skip
def test_wrong_gradient_is_rejected(bug: str, T: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above fails a backward that transposes the final ``S``'s or ``A``'s
    cotangent or the ``S`` checkpoints, reads each ``A`` checkpoint from the slot before (at
    T = 70 the slot after 64 tokens is the kernel's), or scales ``dq`` by 1.001 (so it can
    fail).  The bugs are planted in the chunked backend's backward only, not in the recurrent
    kernel that the budget also consults."""
    adjoint = tc._recurrent_adjoint

    def planted(q, k, v, u, initial, config, start, cotangents, ck, chain):
        do, dS, dA, dz = cotangents
        cks, cka, ckz = ck
        if bug == "transposed_dS":
            dS = dS.mT
        if bug == "transposed_dA":
            dA = dA.mT
        if bug == "transposed_S_checkpoints":
            cks = cks.mT.contiguous()
        if bug == "shifted_A_checkpoints":
            cka = torch.cat([cka[:, :, :1], cka[:, :, :-1]], dim=2)
        dq, *rest = adjoint(
            q, k, v, u, initial, config, start, (do, dS, dA, dz), (cks, cka, ckz), chain
        )
        return (1.001 * dq if bug == "scaled_dq" else dq, *rest)

    monkeypatch.setattr(tc, "_recurrent_adjoint", planted)
    assert _gradients_outside_budget(*_state_gradient_case(T)) != []


def test_backward_reads_the_forwards_chain_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """The backward takes the per-token gate values that the forward stored: it runs with the
    gate rerun refused (the gradient checks above and below run this path)."""
    inputs, initial, cotangents, start = _state_gradient_case(70)
    t = [torch.tensor(x, dtype=torch.float32, requires_grad=True) for x in [*inputs, *initial]]

    def refused(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("the gate pass was rerun")

    monkeypatch.setattr(tc.fused, "_rerun", refused)
    o, state = tc.chunked_vla(*t[:4], initial_state=tuple(t[4:]), chunk_size=16, start=start)
    loss = sum(
        (x * torch.tensor(c, dtype=torch.float32)).sum()
        for x, c in zip((o, *state), cotangents, strict=True)
    )
    grads = torch.autograd.grad(loss, t)
    assert all(bool(torch.isfinite(g).all()) and bool(g.abs().max() > 0) for g in grads)


@pytest.mark.parametrize("bug", ["saved_s_over_pivot", "saved_normaliser_before_key"])
def test_wrong_saved_chain_values_are_rejected(bug: str) -> None:
    """The gradient check fails a forward that stores ``s/δ`` for ``s`` or ``z_{t-1}ᵀq`` for
    the normaliser ``z_tᵀq`` (the forward's outputs are unchanged: only the backward reads
    them)."""
    inputs, initial, cotangents, start = _state_gradient_case(22)
    real = tc.chunked_vla

    def planted(*args, **kwargs):  # type: ignore[no-untyped-def]
        return real(*args, planted_bug=bug, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tc, "chunked_vla", planted)
        assert _gradients_outside_budget(inputs, initial, cotangents, start) != []


@pytest.mark.parametrize(
    ("period", "start", "block", "T", "scale"),
    [(20, 0, 32, 200, 1.0), (20, 7, 48, 150, 4.0), (3, 2, 16, 100, 1.0), (1, 0, 16, 64, 1.0),
     (None, 0, 32, 130, 1.0), (50, 13, 64, 300, 1.0)],
)  # fmt: skip
@pytest.mark.parametrize("normalise", [True, False], ids=["normalised", "products"])
def test_penalty_block_starts_match_the_recurrence(
    period, start, block, T, scale, normalise
) -> None:
    """The block-start penalties (linear-fractional block matrices, one solve per block) equal
    the float64 oracle's ``A`` after every block, to float64 rounding; the nudge clock shifted
    by one step moves them far outside that (the check can fail)."""
    (q, k, v, u), _ = _inputs(T, 8, 4, seed=T)
    u = u * scale
    config = VLAConfig(nudge_period=period)
    BH, dk = 2, 8
    u_t = torch.tensor(u).permute(0, 2, 1, 3).reshape(BH, T, dk)
    A0 = (torch.eye(dk, dtype=torch.float64) / config.lambda0).expand(BH, dk, dk)

    def worst(clock: int) -> float:
        got = tc.penalty_block_starts(
            u_t, A0, start=clock, nudge_period=period, nudge_eta=config.nudge_eta, block=block,
            normalise=normalise,
        )  # fmt: skip
        err = 0.0
        for b in range(1, got.shape[1]):
            t = b * block
            A = recurrence(q[:, :t], k[:, :t], v[:, :t], u[:, :t], config=config, start=start)
            ref = A.state[1].reshape(BH, dk, dk)
            err = max(err, float(np.abs(got[:, b].numpy() - ref).max() / np.abs(ref).max()))
        return err

    assert worst(start) < 1e-13
    if period is not None and period > 1:  # every step nudges at period 1: no clock to shift
        assert worst(start + 1) > 1e-6


@pytest.mark.parametrize(
    ("period", "start", "block", "T", "dk"),
    [(20, 0, 32, 100, 8), (20, 7, 48, 150, 8), (3, 2, 16, 64, 16), (1, 0, 16, 40, 8),
     (50, 13, 64, 300, 40)],
)  # fmt: skip
def test_block_matrix_kernel_equals_the_products_of_pieces(period, start, block, T, dk) -> None:
    """The kernel's block matrices (the block's steps applied column by column) equal the
    products of the pieces' matrices by pairwise trees to float64 rounding, across nudges,
    clock offsets, short last blocks and padded key widths; with each nudge planted before its
    piece's rank-one terms they differ far beyond it (the comparison can fail)."""
    gen = torch.Generator().manual_seed(T)
    u = torch.randn(1, T, 2, dk, generator=gen)
    params = tc._params(VLAConfig(nudge_period=period), torch.device("cpu"))
    u64 = u.permute(0, 2, 1, 3).reshape(2, T, dk).double()
    ref = tc._block_matrices_by_trees(u64, start, period, float(params[2]), block)

    def rel(bug: int) -> float:
        got = tc.penalty_block_matrices(
            u, params, start=start, nudge_period=period, block=block, bug=bug
        )
        return float((got - ref).abs().amax() / ref.abs().amax())

    assert rel(0) < 1e-14
    assert rel(tc.PLANTED_BUGS["block_matrix_nudge_first"]) > 1e-4
    # Without the last block (the forward's call): the others unchanged, the last left zero.
    short = tc.penalty_block_matrices(
        u, params, start=start, nudge_period=period, block=block, last=False
    )
    assert float((short[:, :-1] - ref[:, :-1]).abs().amax() / ref.abs().amax()) < 1e-14
    assert not short[:, -1].any()


@pytest.mark.parametrize("u_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(
    ("period", "start", "block", "T", "dk"),
    [(20, 7, 48, 150, 8), (3, 2, 16, 64, 16), (3, 1, 32, 40, 40)],  # the last: two programs a block
)
def test_float32_block_matrices_are_within_a_roundoff_a_token(
    period, start, block, T, dk, u_dtype
) -> None:
    """The float32 chain's block matrices (float32, tf32x3 products of split operands; 16-bit
    penalties taken whole) equal the products of the pieces' matrices within
    ``FLOAT32_CHAIN_RTOL_PER_TOKEN`` per token of a block, the float32 chain's own check
    (relative to the largest entry); with each nudge planted before its piece's rank-one
    terms they do not."""
    gen = torch.Generator().manual_seed(T)
    u = torch.randn(1, T, 2, dk, generator=gen).to(u_dtype)
    params = tc._params(VLAConfig(nudge_period=period), torch.device("cpu"))
    u64 = u.permute(0, 2, 1, 3).reshape(2, T, dk).double()
    ref = tc._block_matrices_by_trees(u64, start, period, float(params[2]), block)

    def rel(bug: int) -> float:
        got = tc.penalty_block_matrices(
            u, params, start=start, nudge_period=period, block=block, bug=bug,
            dtype=torch.float32,
        )  # fmt: skip
        assert got.dtype == torch.float32
        return float((got.double() - ref).abs().amax() / ref.abs().amax())

    tol = tc.FLOAT32_CHAIN_RTOL_PER_TOKEN * block
    assert rel(0) < tol
    assert rel(tc.PLANTED_BUGS["block_matrix_nudge_first"]) > 10 * tol


@pytest.mark.parametrize(("dk", "NB"), [(40, 5), (5, 3)])
def test_block_starts_kernel_equals_the_products(dk: int, NB: int) -> None:
    """The products-only block starts' kernel (``NB − 1`` dependent products in one launch, the
    columns over three programs and the rows in three products at dk = 40) equals the batched
    products block after block to float64 rounding; taking each start from the matrix of the
    block before (one block too late) differs far beyond it."""
    BH = 3
    g = torch.Generator().manual_seed(dk)
    Bm = torch.eye(2 * dk, dtype=torch.float64) + 0.1 * torch.randn(
        BH, NB, 2 * dk, 2 * dk, generator=g, dtype=torch.float64
    )
    x0 = torch.randn(BH, 2 * dk, dk, generator=g, dtype=torch.float64)

    def chain(late: int) -> torch.Tensor:
        xs = [x0]
        for b in range(NB - 1):
            xs.append(Bm[:, max(b - late, 0)] @ xs[-1])
        return torch.stack(xs)

    got = torch.empty(NB, BH, 2 * dk, dk, dtype=torch.float64)
    got[0] = x0
    tc.kernels.penalty_block_starts_kernel[(BH, -(-dk // 16))](
        Bm, got, NB, BH, dk, 0, NB - 1, R=max(16, tc._pow2(2 * dk)), KB=32, NC=16
    )
    ref = chain(0)
    scale = float(ref.abs().max())
    assert float((got - ref).abs().max()) < 1e-13 * scale
    assert float((chain(1) - ref).abs().max()) > 1e-3 * scale


def _long_walk():  # type: ignore[no-untyped-def]
    """The layer's penalties over 32768 tokens at dk = 16 (paper preset, correlated
    directions, 32 blocks of 1024): ``(T, dk, block, A0, walk, matrices, ref)``, ``ref`` the
    normalised starts."""
    T, dk, block = 32768, 16, 1024
    g = torch.Generator().manual_seed(0)
    p = torch.randn(1, T, dk, generator=g, dtype=torch.float64) @ torch.randn(
        dk, dk, generator=g, dtype=torch.float64
    )
    u = p / p.norm(dim=-1, keepdim=True) / dk**0.5
    A0 = torch.eye(dk, dtype=torch.float64)[None] / 0.1
    walk = dict(start=0, nudge_period=20, nudge_eta=1e-3, block=block)
    matrices = tc._block_matrices_by_trees(u, 0, 20, 1e-3, block)
    ref = tc.penalty_block_starts(u, A0, normalise=True, matrices=matrices, **walk)
    return T, dk, block, A0, walk, matrices, ref


def test_products_only_starts_stay_accurate_over_long_sequences(monkeypatch) -> None:
    """Products-only starts over 32768 tokens at dk = 16 (the layer's penalties, paper
    preset, 32 blocks of 1024): applied in spans of ``PRODUCTS_ONLY_SPAN_PER_KEY · dk`` tokens
    they equal the normalised starts to float64 rounding, where applied over the whole
    sequence they err past ``BLOCK_START_RTOL`` (the block-end check would fail)."""
    T, _dk, _block, A0, walk, matrices, ref = _long_walk()

    def rel() -> float:
        got = tc.penalty_block_starts(None, A0, normalise=False, matrices=matrices, **walk)
        return float(((got - ref).abs().amax(dim=(-2, -1)) / ref.abs().amax(dim=(-2, -1))).max())

    assert rel() < 1e-12
    monkeypatch.setattr(tc, "PRODUCTS_ONLY_SPAN_PER_KEY", T)
    assert rel() > tc.BLOCK_START_RTOL


def test_cholesky_starts_stay_within_the_float32_chains_check(monkeypatch) -> None:
    """The Cholesky form of the products-only starts (the float32 chain's) on the long
    sequence above: within a tenth of the float32 chain's check (``block · 2^-24``) of the
    normalised starts, and within ``BLOCK_START_RTOL`` as well; with ``Θ`` read as ``Π``
    (``S = Πᵀ Π``, planted) far outside it."""
    _T, dk, block, A0, walk, matrices, ref = _long_walk()

    def rel() -> float:
        got = tc.penalty_block_starts(None, A0, normalise=False, matrices=matrices,
                                      cholesky=True, **walk)  # fmt: skip
        return float(((got - ref).abs().amax(dim=(-2, -1)) / ref.abs().amax(dim=(-2, -1))).max())

    tolerance = tc.FLOAT32_CHAIN_RTOL_PER_TOKEN * block
    assert rel() < min(0.1 * tolerance, tc.BLOCK_START_RTOL)
    real = tc._solve_block_starts

    def planted(XX, cholesky=False):  # type: ignore[no-untyped-def]
        XX = XX.clone()
        XX[:, :, dk:] = XX[:, :, :dk]
        return real(XX, cholesky)

    monkeypatch.setattr(tc, "_solve_block_starts", planted)
    assert rel() > 10 * tolerance


def test_block_starts_without_directions_or_matrices_is_refused() -> None:
    from vla_verify.errors import VLAInputError

    A0 = torch.eye(3, dtype=torch.float64)[None]
    with pytest.raises(VLAInputError, match="u"):
        tc.penalty_block_starts(None, A0, start=0, nudge_period=3, nudge_eta=0.1, block=4)


def test_block_matrix_nudge_first_is_caught() -> None:
    """The planted kernel bug end to end: its wrong block matrices give wrong starts, the
    block-end check catches them and the second pass (one block from ``A_0``, no matrices)
    gives the oracle's output (the kernel's own test above rejects its matrices)."""
    inputs, _ = _inputs(70, 8, 8, seed=3)
    before = tc.BLOCK_START_FALLBACKS[0]
    assert _outside_budget(_planted_blocks("block_matrix_nudge_first"), inputs, None,
                           STRONG_NUDGE, 0, 16) == []  # fmt: skip
    assert tc.BLOCK_START_FALLBACKS[0] == before + 1


@pytest.mark.parametrize(
    ("config", "start", "state"),
    [(PAPER, 0, False), (STRONG_NUDGE, 7, True), (VLAConfig.exact(), 3, True)],
    ids=["paper", "nudge-start7-state", "exact-state"],
)
def test_blocked_penalty_chain_matches_the_oracle(config, start, state) -> None:
    """Blocks of 16 tokens (five blocks at T = 70), each from its computed start penalty."""
    inputs, initial = _inputs(70, 8, 8, seed=3, state=state)

    def blocked(*args, **kwargs):
        return tc.chunked_vla(*args, chunk_size=16, penalty_block=16, **kwargs)

    before = tc.BLOCK_START_FALLBACKS[0]
    assert _outside_budget(blocked, inputs, initial, config, start, 16) == []
    assert tc.BLOCK_START_FALLBACKS[0] == before  # the products-only starts passed the check


@pytest.mark.parametrize("factorisation", ["elimination", "elimination_inverse"])
def test_penalty_chain_by_elimination_matches_the_oracle(
    monkeypatch: pytest.MonkeyPatch, factorisation: str
) -> None:
    """The penalty chain's ``W`` and pivots by one elimination on ``[I + G | Y]``
    (``PENALTY_FACTORISATION``) within the budget: one chain of chunks of 16 and 32 tokens
    (paper, strong nudges: the upper triangle of ``G`` is not the lower's transpose there;
    exact preset), and in blocks; elimination that subtracts the rows of ``Y`` as loaded
    instead of as solved is rejected."""
    monkeypatch.setattr(tc, "PENALTY_FACTORISATION", factorisation)
    inputs, initial = _inputs(70, 8, 8, seed=3, state=True)
    for C, config, start in ((16, PAPER, 0), (32, STRONG_NUDGE, 7), (16, VLAConfig.exact(), 3)):

        def one_chain(*args, C=C, **kwargs):  # type: ignore[no-untyped-def]
            return tc.chunked_vla(*args, chunk_size=C, penalty_chunk=C, **kwargs)

        assert _outside_budget(one_chain, inputs, initial, config, start, C) == []
    assert _outside_budget(_planted_blocks(None), inputs, initial, STRONG_NUDGE, 7, 16) == []

    def planted(*args, **kwargs):  # type: ignore[no-untyped-def]
        return tc.chunked_vla(*args, chunk_size=16, planted_bug="elimination_unsolved_row",
                              **kwargs)  # fmt: skip

    assert _outside_budget(planted, inputs, initial, STRONG_NUDGE, 7, 16) != []


def _planted_blocks(bug: str | None):
    def planted(*args, **kwargs):
        return tc.chunked_vla(*args, chunk_size=16, penalty_block=16, planted_bug=bug, **kwargs)

    return planted


def test_unchecked_block_starts_without_nudges_are_rejected() -> None:
    inputs, _ = _inputs(70, 8, 8, seed=3)
    planted = _planted_blocks("unchecked_block_starts")
    assert _outside_budget(planted, inputs, None, STRONG_NUDGE, 0, 16) != []


def test_the_block_end_check_catches_wrong_block_starts() -> None:
    """The same wrong starts with the check on: the chain's block ends disagree with them, the
    second pass runs the chain in one block (counted on the device), and the result is within
    the budget."""
    inputs, _ = _inputs(70, 8, 8, seed=3)
    before = tc.BLOCK_START_FALLBACKS[0]
    planted = _planted_blocks("block_starts_without_nudges")
    assert _outside_budget(planted, inputs, None, STRONG_NUDGE, 0, 16) == []
    assert tc.BLOCK_START_FALLBACKS[0] == before + 1


def test_float32_chain_checks_its_block_starts_at_its_own_precision(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The float32 chain (``penalty_dtype="float32"``) starts from the float64 products-only
    block starts and checks its block ends against them at ``FLOAT32_CHAIN_RTOL_PER_TOKEN``
    per token of a block: with bf16 inputs on the layer's penalties the check passes and the
    output is within the bf16 budget; from wrong starts (without the nudges, or every block
    from ``A_0``) it fails, the second pass runs the float32 chain in one block, and the output
    is within the budget again; with the tolerance lifted the wrong starts' output is not."""
    inputs, _ = _inputs(160, 16, 16, seed=3)

    def fn(*args, **kwargs):  # type: ignore[no-untyped-def]
        return tc.chunked_vla(*args, chunk_size=16, penalty_block=32, penalty_dtype="float32",
                              **kwargs)  # fmt: skip

    def planted(*args, **kwargs):  # type: ignore[no-untyped-def]
        return fn(*args, planted_bug="block_starts_without_nudges", **kwargs)

    bf16 = torch.bfloat16
    before = tc.BLOCK_START_FALLBACKS[0]
    assert _outside_budget(fn, inputs, None, STRONG_NUDGE, 0, 16, dtype=bf16) == []
    assert tc.BLOCK_START_FALLBACKS[0] == before
    assert _outside_budget(planted, inputs, None, STRONG_NUDGE, 0, 16, dtype=bf16) == []
    assert tc.BLOCK_START_FALLBACKS[0] == before + 1
    real = tc.penalty_block_starts
    monkeypatch.setattr(tc, "penalty_block_starts",
                        lambda *a, **kw: real(*a, **kw)[:, :1].expand(-1, 5, -1, -1))  # fmt: skip
    assert _outside_budget(fn, inputs, None, STRONG_NUDGE, 0, 16, dtype=bf16) == []
    assert tc.BLOCK_START_FALLBACKS[0] == before + 2
    monkeypatch.setattr(tc, "FLOAT32_CHAIN_RTOL_PER_TOKEN", 1.0)
    assert _outside_budget(fn, inputs, None, STRONG_NUDGE, 0, 16, dtype=bf16) != []
    monkeypatch.setattr(tc, "penalty_block_starts", real)
    assert _outside_budget(planted, inputs, None, STRONG_NUDGE, 0, 16, dtype=bf16) != []


@pytest.mark.parametrize("T", [40, 70])
def test_float32_chain_on_float32_inputs_is_within_the_float32_budget(T: int) -> None:
    """The float32 chain on float32 inputs (``penalty_dtype="float32"``, one block: no block-end
    check to fall back from) is within the float32 budget on layer-like penalties.  Their
    products take all three tf32 products of the split operands, where 16-bit penalties, exact
    in tf32, take two; a float32 penalty read as its own remainder puts every output far
    outside the budget."""
    inputs, _ = _inputs(T, 16, 16, seed=5)

    def fn(*args, **kwargs):  # type: ignore[no-untyped-def]
        return tc.chunked_vla(*args, chunk_size=16, penalty_dtype="float32", **kwargs)

    assert _outside_budget(fn, inputs, None, PAPER, 0, 16) == []


def test_training_forward_in_blocks_passes_the_check_as_inference_does() -> None:
    """The training forward (inputs that need gradients: its kernels also store what the
    backward reads) in blocks of 16 tokens passes the block-start check where the inference
    forward does, with the same output and state bit for bit (the stores write other buffers
    only); with wrong block starts (planted) the check fails in training too."""
    inputs, _ = _inputs(70, 8, 8, seed=3)
    t = [torch.tensor(x, dtype=torch.float32) for x in inputs]

    def forward(grad: bool, bug: str | None = None):  # type: ignore[no-untyped-def]
        x = [a.clone().requires_grad_(grad) for a in t]
        o, state = tc.chunked_vla(*x, config=STRONG_NUDGE, chunk_size=16, penalty_block=16,
                                  planted_bug=bug)  # fmt: skip
        return [o.detach(), *(s.detach() for s in state)]

    before = tc.BLOCK_START_FALLBACKS[0]
    inference = forward(grad=False)
    training = forward(grad=True)
    assert tc.BLOCK_START_FALLBACKS[0] == before
    for got, want in zip(training, inference, strict=True):
        assert torch.equal(got, want)
    forward(grad=True, bug="block_starts_without_nudges")
    assert tc.BLOCK_START_FALLBACKS[0] == before + 1


def test_non_finite_block_starts_fail_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """Block starts that came out NaN (the products-only starts' solve reports no singular
    ``Θ``) fail the block-end check, whose comparisons are all false on NaN: the second pass
    runs and the result is within the budget."""
    inputs, _ = _inputs(70, 8, 8, seed=3)
    real = tc.penalty_block_starts

    def nan_starts(*args, **kwargs):  # type: ignore[no-untyped-def]
        A = real(*args, **kwargs)
        if not kwargs.get("normalise", True):
            A = A.clone()
            A[:, 1:] = float("nan")
        return A

    monkeypatch.setattr(tc, "penalty_block_starts", nan_starts)
    before = tc.BLOCK_START_FALLBACKS[0]
    assert _outside_budget(_planted_blocks(None), inputs, None, STRONG_NUDGE, 0, 16) == []
    assert tc.BLOCK_START_FALLBACKS[0] == before + 1


def test_the_second_pass_writes_only_after_a_failed_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """The second pass's launches (``COND``) write nothing where the block-start check passed
    and over every output buffer where it failed: each buffer is filled with a sentinel before
    the launch (and given back its values where nothing was written)."""
    inputs, _ = _inputs(70, 8, 8, seed=3)
    written = {"penalty_chain_kernel": 4, "state_prep_kernel": 3, "state_starts_kernel": 4,
               "state_output_kernel": 6}  # fmt: skip
    changed: list[tuple[str, bool]] = []

    class Spy:
        def __init__(self, name: str, real) -> None:  # type: ignore[no-untyped-def]
            self.name, self.real = name, real

        def __getitem__(self, grid):  # type: ignore[no-untyped-def]
            def launch(*args, **kwargs):  # type: ignore[no-untyped-def]
                out = args[written[self.name]]
                if not kwargs.get("COND"):
                    self.real[grid](*args, **kwargs)
                    return
                before = out.clone()
                out.fill_(1234.5)
                self.real[grid](*args, **kwargs)
                touched = bool((out != 1234.5).any())
                if not touched:
                    out.copy_(before)
                changed.append((self.name, touched))

            return launch

    for name in written:
        monkeypatch.setattr(tc.kernels, name, Spy(name, getattr(tc.kernels, name)))
    for bug, failed in ((None, False), ("block_starts_without_nudges", True)):
        changed.clear()
        assert _outside_budget(_planted_blocks(bug), inputs, None, STRONG_NUDGE, 0, 16) == []
        assert sorted(changed) == sorted((name, failed) for name in written), changed


def test_indefinite_initial_penalty_runs_one_block() -> None:
    """An indefinite initial ``A`` can floor a denominator, which block starts cannot express:
    the chain then runs in one block, so any ``penalty_block`` gives the one-block result."""
    inputs, initial = _inputs(40, 8, 8, seed=4, state=True)
    S, _, z = (torch.tensor(x, dtype=torch.float32) for x in initial)
    A = 10 * torch.eye(8).expand(1, 2, 8, 8).clone()
    A[..., 0, 0] = -0.5  # one negative eigenvalue; 1 + uᵀAu stays near 1 (finite outputs)
    state = (S, A, z)
    t = [torch.tensor(x, dtype=torch.float32) for x in inputs]
    outs = [
        tc.chunked_vla(*t, initial_state=state, chunk_size=16, penalty_block=block)
        for block in (16, 48)
    ]
    assert torch.equal(outs[0][0], outs[1][0])
    assert torch.equal(outs[0][1][1], outs[1][1][1])


def test_bad_options_are_refused() -> None:
    with pytest.raises(UnsupportedConfigurationError) as info:
        backends.get("triton_chunked", chunk_size=48)
    assert info.value.argument == "chunk_size"
    x = torch.ones(1, 4, 1, 4)
    with pytest.raises(UnsupportedConfigurationError) as info:
        tc.chunked_vla(x, x, x, x, input_precision="fast")
    assert info.value.argument == "input_precision"
    for block in (8, 24, True):
        with pytest.raises(UnsupportedConfigurationError) as info:
            tc.chunked_vla(x, x, x, x, penalty_block=block)
        assert info.value.argument == "penalty_block"
    bad = x.clone()
    bad[0, 2, 0, 1] = float("nan")
    with pytest.raises(NonFiniteError) as info:
        tc.chunked_vla(x, bad, x, x, check_finite=True)
    assert info.value.argument == "k"


def test_auto_penalty_dtype_is_float32_in_the_bf16_inference_forward_only() -> None:
    """``penalty_dtype="auto"`` (the default) runs the float32 chain in the inference forward
    of bf16 inputs and the float64 chain for other inputs and in training: the state ``A`` of
    the default forward is the explicit chain's, bit for bit, and not the other chain's."""
    f32, f64, bf16 = torch.float32, torch.float64, torch.bfloat16
    assert tc._penalty_dtype("auto", bf16, training=False) == f32
    assert tc._penalty_dtype("auto", bf16, training=True) == f64
    for dtype in (torch.float16, f32):
        assert tc._penalty_dtype("auto", dtype, training=False) == f64
    assert tc._penalty_dtype("float64", bf16, training=False) == f64
    assert tc._penalty_dtype("float32", f32, training=True) == f32
    inputs, _ = _inputs(64, 16, 16, seed=5)

    def A_of(penalty_dtype: str | None, dtype: torch.dtype, grad: bool = False) -> torch.Tensor:
        t = [torch.tensor(x, dtype=dtype, requires_grad=grad) for x in inputs]
        kw = {} if penalty_dtype is None else {"penalty_dtype": penalty_dtype}
        return tc.chunked_vla(*t, chunk_size=16, penalty_block=32, **kw)[1][1].detach()

    default = A_of(None, bf16)
    assert torch.equal(default, A_of("float32", bf16))
    assert not torch.equal(default, A_of("float64", bf16))
    assert torch.equal(A_of(None, bf16, grad=True), A_of("float64", bf16, grad=True))
    assert torch.equal(A_of(None, f32), A_of("float64", f32))


def test_float32_penalty_chain_is_outside_the_budget_on_strong_penalties() -> None:
    """Why the penalty chain of float32 inputs runs in float64 (``docs/design/triton_chunked.md``):
    the Woodbury form re-derives every ``A_t`` from the chunk-start ``A`` and cancels at that
    scale, so on strong penalties (the ``gaussian`` regime, ``||u|| ≈ 4``) a float32 chain puts
    ``S`` outside the spec §4 budget where the float64 chain is well inside it.  Four chunks
    of 32 tokens: at two chunks the float32 chain's worst ratio sits near the budget (0.8 to
    1.2 of it over seeds), at four it is 1.7 to 2.5 of it and the float64 chain's 0.04."""
    from vla_verify.properties.strategies import make_penalties

    def with_chain(penalty_dtype: str):
        def fn(*args, **kwargs):
            return tc.chunked_vla(*args, chunk_size=32, penalty_dtype=penalty_dtype, **kwargs)

        return fn

    for seed in range(3):
        rng = np.random.default_rng(seed)
        B, T, H, dk = 1, 128, 1, 16
        k_raw = rng.standard_normal((B, T, H, dk))
        u = make_penalties(rng, "gaussian", (B, T, H, dk), k_raw)
        inputs = [
            np.exp(0.5 * rng.standard_normal((B, T, H, dk))),
            np.exp(0.5 * k_raw),
            rng.standard_normal((B, T, H, dk)),
            u,
        ]
        assert _outside_budget(with_chain("float64"), inputs, None, PAPER, 0, 32) == []
        bad = _outside_budget(with_chain("float32"), inputs, None, PAPER, 0, 32)
        assert any(name.startswith("S") for name in bad), (seed, bad)


def test_registry_backend_passes_validate() -> None:
    """``validate`` (budget, state carry, the chunked floor from the ``chunk_size`` option) on a
    few drawn examples of the paper preset, nudges inside chunks of 16."""
    from vla_verify import validate
    from vla_verify.properties.strategies import ShapeBounds

    report = validate(
        backends.get("triton_chunked", chunk_size=16),
        config=PAPER,
        array="torch",
        dtype="float32",
        max_examples=2,
        seed=1,
        bounds=ShapeBounds(max_B=1, max_H=2, max_T=45, min_T=21, max_dk=8, max_dv=8),
    )
    assert report.passed, report.summary()
    assert report.chunk_size == 16


def test_check_support_says_what_cannot_run() -> None:
    b = backends.get("triton_chunked")
    shapes = backends.registry.Shapes(1, 8, 1, 4, 4)
    assert b.check_support(PAPER, shapes, "float32") is None
    reason = b.check_support(PAPER, shapes, "float64")
    assert reason is not None and "torch_chunked" in reason
    assert b.check_support(PAPER, backends.registry.Shapes(1, 8, 1, 256, 4), "float32")


@pytest.mark.parametrize(("C", "dk", "dv", "T"), [(16, 8, 12, 40), (32, 40, 20, 70),
                                                  (64, 24, 16, 150)])  # fmt: skip
def test_ut_transform_by_blocks_equals_the_inverse(C: int, dk: int, dv: int, T: int) -> None:
    """``state_prep_kernel`` (16-row blocks) gives ``K̃ = T K̂``, ``Ṽ = T V`` with
    ``T = (I + tril(K̂ Âᵀ, −1))^{-1}`` per chunk, against a float64 triangular solve, across
    padded widths and a short last chunk; without the ``N_21 T_10`` term of ``T_20`` (chunks
    of 64) it does not.  It also stores each chunk's sum of keys, a known answer."""
    gen = torch.Generator().manual_seed(C)
    H = 2
    k = torch.rand(1, T, H, dk, generator=gen) + 0.1
    v = torch.randn(1, T, H, dv, generator=gen)
    BK, BV = max(32, tc._pow2(dk)), tc._pow2(dv)
    TP = -(-T // C) * C
    a = torch.rand(H, T, dk, generator=gen)
    gates = torch.zeros(H, TP, BK)
    gates[:, :T, :dk] = a / a.norm(dim=-1, keepdim=True)
    params = tc._params(VLAConfig(), torch.device("cpu"))

    key_sums = torch.full((1, TP // C, H, dk), float("nan"))

    def transform(bug: int) -> tuple[torch.Tensor, torch.Tensor]:
        Kt = torch.empty(H, TP, BK)
        Vt = torch.empty(H, TP, BV)
        kernels.state_prep_kernel[(TP // C, H)](
            k, v, gates, Kt, Vt, key_sums, params, gates, T, H, H * dk, dk, H * dv, dv,
            DK=dk, DV=dv, BK=BK, BV=BV, C=C, TP=TP, OP=tl.float32, PREC="ieee", BUG=bug,
        )  # fmt: skip
        return Kt[:, :T, :dk].double(), Vt[:, :T, :dv].double()

    kh = k[0].double().transpose(0, 1)
    sums = torch.stack([kh[:, c0 : c0 + C].sum(dim=1) for c0 in range(0, T, C)])
    kh = kh / kh.norm(dim=-1, keepdim=True)
    vv = v[0].double().transpose(0, 1)
    Kref, Vref = torch.empty_like(kh), torch.empty_like(vv)
    # The error model of a triangular solve in float32 (Higham, Thm 8.5):
    # |x̂ − x| ≤ γ_C |L^{-1}| |L| |x|, γ_C ≈ C·2^-24; the blocked form adds the products
    # T_ij = −T_ii Σ N_im T_mj and T K̂ (three more of length ≤ C): a factor 4.
    Kbound, Vbound = torch.empty_like(kh), torch.empty_like(vv)
    for c0 in range(0, T, C):
        sl = slice(c0, min(T, c0 + C))
        unit = torch.eye(sl.stop - c0, dtype=torch.float64)
        lower = unit + torch.tril(kh[:, sl] @ gates[:, sl, :dk].double().mT, -1)
        Kref[:, sl] = torch.linalg.solve_triangular(lower, kh[:, sl], upper=False)
        Vref[:, sl] = torch.linalg.solve_triangular(lower, vv[:, sl], upper=False)
        growth = torch.linalg.inv(lower).abs() @ lower.abs()
        Kbound[:, sl] = growth @ Kref[:, sl].abs()
        Vbound[:, sl] = growth @ Vref[:, sl].abs()
    gamma = 4 * C * 2.0**-24

    def outside(bug: int) -> float:
        """Largest error in units of the bound (≤ 1 within it)."""
        Kt, Vt = transform(bug)
        return max(float(((Kt - Kref).abs() / (gamma * Kbound + 1e-30)).max()),
                   float(((Vt - Vref).abs() / (gamma * Vbound + 1e-30)).max()))  # fmt: skip

    assert outside(0) <= 1.0
    # Chunk sums of at most 64 positive float32 keys: within 64·2^-24 relative.
    got = key_sums[0].double().transpose(0, 1)  # [H, NC, dk]
    assert torch.allclose(got, sums.transpose(0, 1), rtol=64 * 2.0**-24, atol=0)
    if C == 64:
        assert outside(tc.PLANTED_BUGS["ut_block_term"]) > 100.0


def test_ut_block_term_bug_is_rejected() -> None:
    """The planted slip in the UT transform's blocks falls outside the oracle's budget end to
    end (chunks of 64: the slip is in the third block row)."""
    inputs, _ = _inputs(100, 8, 6, seed=4)

    def planted(*args, **kwargs):
        return tc.chunked_vla(*args, chunk_size=64, planted_bug="ut_block_term", **kwargs)

    assert _outside_budget(planted, inputs, None, PAPER, 0, 64) != []


def test_penalty_block_length_follows_the_measured_rows() -> None:
    """The default block off a GPU: one block up to the key width's row (1024 tokens up to 64
    wide, 2048 up to 128), else at least its row (256 / 512 tokens), at most 16 blocks (32 of
    2-warp programs: a 64-wide key tile from 16384 tokens), a multiple of the penalty chunk; an
    explicit block is kept."""
    assert tc.penalty_block_length(16384, 16, dk=8) == 1024
    assert tc.penalty_block_length(16384, 16, dk=64) == 512
    assert tc.penalty_block_length(8192, 16, dk=64) == 512
    assert tc.penalty_block_length(16384, 16, dk=65) == 1024
    assert tc.penalty_block_length(65536, 16, dk=64) == 2048
    assert tc.penalty_block_length(65536, 16, dk=128) == 4096
    assert tc.penalty_block_length(4096, 16, dk=128) == 512
    assert tc.penalty_block_length(4096, 16, dk=64) == 256
    assert tc.penalty_block_length(1024, 16, dk=64) == 1024
    assert tc.penalty_block_length(2048, 16, dk=128) == 2048
    assert tc.penalty_block_length(1000, 48, dk=64) == 1008  # one block, 21 chunks
    assert tc.penalty_block_length(16384, 16, 256, dk=128) == 256
    assert tc.penalty_block_length(16384, 16, dk=64, heads=16, device="cpu") == 512


def test_penalty_blocks_fill_one_wave_of_programs(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CUDA device the blocks are at most the penalty programs that run at once shared
    among the heads: on 132 SMs of 65536 registers, 264 programs of 4 warps (D = 64), 528 of 2
    (D = 64 from 16384 tokens) and 132 of 8 (D = 128), so at B·H = 16 16, 32 and 8 blocks;
    past one wave of heads, one block."""
    from types import SimpleNamespace

    props = SimpleNamespace(multi_processor_count=132, regs_per_multiprocessor=65536)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    monkeypatch.setattr(tc, "_PROGRAMS_AT_ONCE", {})
    assert tc._penalty_programs_at_once("cuda:0", 4) == 264
    assert tc._penalty_programs_at_once("cuda:0", 8) == 132
    assert tc._penalty_programs_at_once("cuda:0", 2) == 528

    def block(T: int, dk: int, heads: int) -> int:
        return tc.penalty_block_length(T, 16, dk=dk, heads=heads, device="cuda:0")

    assert [block(T, 128, 16) for T in (2048, 4096, 8192, 16384, 65536)] == [
        2048, 512, 1024, 2048, 8192,
    ]  # fmt: skip
    assert [block(T, 64, 16) for T in (1024, 4096, 8192, 16384, 65536)] == [
        1024, 256, 512, 512, 2048,
    ]  # fmt: skip
    assert block(16384, 128, 132) == 16384
    assert block(8192, 64, 64) == 2048  # 264 // 64 = 4 blocks of 4 warps
    assert block(16384, 64, 64) == 2048  # 528 // 64 = 8 blocks of 2 warps
    # More warps per program, fewer at once: 16 warps at D = 64 fit one to an SM.
    monkeypatch.setattr(tc, "PENALTY_CHAIN_WARPS", {64: 16})
    assert block(16384, 64, 16) == 2048


def test_gradients_with_floored_denominators() -> None:
    """``sm_floor = 1.5``, above some ``1 + uᵀAu`` of these penalties (``‖u‖² = 1/dk`` scaled
    by 1.5, so ``uᵀAu`` spans the floor): the kept pivots before and after the floor route
    ``dδ`` only through the unfloored steps, within the budget against torch_chunked."""
    inputs, initial, cotangents, start = _state_gradient_case(22)
    inputs[3] = inputs[3] * 1.5
    from vla_verify.backends.torch_chunked import chunked
    from vla_verify.gradient_check import check_gradients

    config = VLAConfig(sm_floor=1.5)

    def torch_fn(*a, **kw):  # type: ignore[no-untyped-def]
        return chunked(*a, penalty_chain="woodbury", chunk_size=16, start=start, **kw)

    def triton_fn(*a, **kw):  # type: ignore[no-untyped-def]
        return tc.chunked_vla(*a, chunk_size=16, start=start, **kw)

    checks = check_gradients(
        triton_fn, torch_fn, [*inputs, *initial], cotangents, config=config, dtype="float32",
        baselines=[torch_fn], copies=2, terms=inputs[0].shape[-1] + 16,
    )  # fmt: skip
    assert all(c.passed for c in checks.values()), {n: c.ratio for n, c in checks.items()}


def test_pivots_without_their_floor_are_rejected(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The check above fails a backward that takes the raw pivots for the floored ones (the
    floor lost between the forward and the backward)."""
    adjoint = tc._recurrent_adjoint

    def planted(*args):  # type: ignore[no-untyped-def]
        kh, ah, sc, sv, cs = args[-1]
        cs = cs.clone()
        cs[..., 1] = cs[..., 0]
        return adjoint(*args[:-1], (kh, ah, sc, sv, cs))

    monkeypatch.setattr(tc, "_recurrent_adjoint", planted)
    with pytest.raises(AssertionError):
        test_gradients_with_floored_denominators()


def test_offsets_past_32_bits_are_refused() -> None:
    """A request whose offsets inside one batch element pass 2**31 − 1 (the kernels index a
    token in 32 bits) is refused naming ``q``, by :func:`chunked_vla` and the registry backend,
    before any buffer is allocated (the inputs here are broadcast views, no memory); one token
    less is accepted by the check."""
    from vla_verify.backends.triton_common import MAX_OFFSET, offsets_reason

    H, D = 16, 128
    T = MAX_OFFSET // (H * D) - 64 + 1  # (T + 64)·H·D just past the limit
    assert offsets_reason(T - 1, H, D, D) is None
    assert offsets_reason(T, H, D, D) is not None
    x = torch.zeros((), dtype=torch.bfloat16).expand(1, T, H, D)
    with pytest.raises(UnsupportedConfigurationError) as err:
        tc.chunked_vla(x, x, x, x)
    assert err.value.argument == "q" and "32-bit" in str(err.value)
    with pytest.raises(UnsupportedConfigurationError, match="32-bit"):
        backends.get("triton_chunked")(x, x, x, x)


def test_penalty_chain_warps_reach_the_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """``PENALTY_CHAIN_WARPS`` sets the penalty kernel's ``num_warps`` at its key tile width
    (here BK = 32) and leaves the state kernels' count elsewhere; the interpreter ignores warps,
    so the launch is recorded."""
    real = tc.kernels.penalty_chain_kernel
    warps: list[int] = []

    class Recorded:
        def __getitem__(self, grid):  # type: ignore[no-untyped-def]
            def launch(*args, **kwargs):  # type: ignore[no-untyped-def]
                warps.append(kwargs["num_warps"])
                return real[grid](*args, **kwargs)

            return launch

    monkeypatch.setattr(tc.kernels, "penalty_chain_kernel", Recorded())
    inputs, _ = _inputs(20, 8, 8)
    x = [torch.tensor(a, dtype=torch.float32) for a in inputs]
    tc.chunked_vla(*x, chunk_size=16)
    monkeypatch.setattr(tc, "PENALTY_CHAIN_WARPS", {32: 2})
    tc.chunked_vla(*x, chunk_size=16)
    monkeypatch.setattr(tc, "PENALTY_CHAIN_WARPS", {64: 2})
    tc.chunked_vla(*x, chunk_size=16)
    assert warps == [4, 2, 4]


def test_the_penalty_kernel_halves_its_warps_on_long_sequences() -> None:
    """Half the state kernels' warps (4 up to a 64-wide key tile, 8 above) from
    ``HALF_PENALTY_WARPS_FROM`` tokens at a key tile width and chain dtype; a row for one chain
    dtype leaves the other's count."""
    assert [tc._penalty_chain_warps(64, T) for T in (4096, 16383, 16384, 65536)] == [4, 4, 2, 2]
    assert tc._penalty_chain_warps(33, 65536, "float32") == 2
    assert tc._penalty_chain_warps(32, 65536) == 4
    assert tc._penalty_chain_warps(128, 65536) == 8
    table = {(128, "float32"): 8192}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tc, "HALF_PENALTY_WARPS_FROM", table)
        assert [tc._penalty_chain_warps(128, T, "float32") for T in (4096, 8192)] == [8, 4]
        assert tc._penalty_chain_warps(128, 8192, "float64") == 8
        assert tc._penalty_chain_warps(64, 65536, "float32") == 4


@pytest.mark.parametrize("step", [1, 2, 32])
def test_z_scan_carries_across_its_steps(monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    """``z`` at every chunk start by a scan of the chunks' sums of keys, ``step`` chunks a step
    (``_KEY_SUM_CHUNKS``): across 7 chunks of 16 tokens and several steps, from an initial
    state, ``o`` and the state are within the budget and the last ``z`` is ``z_0 + Σ k``."""
    monkeypatch.setattr(tc, "_KEY_SUM_CHUNKS", step)
    inputs, initial = _inputs(100, 8, 6, state=True, seed=5)

    def fn(*args, **kwargs):
        return tc.chunked_vla(*args, chunk_size=16, **kwargs)

    assert _outside_budget(fn, inputs, initial, PAPER, 3, 16) == []
    t = [torch.tensor(x, dtype=torch.float32) for x in inputs]
    state = tuple(torch.tensor(x, dtype=torch.float32) for x in initial)
    _, (_, _, z) = fn(*t, initial_state=state)
    want = state[2].double() + t[1].double().sum(dim=1)
    assert torch.allclose(z.double(), want, rtol=1e-6, atol=0)


@triton.jit
def _mm_tile(a_ptr, b_ptr, c_ptr, N: tl.constexpr, PREC: tl.constexpr):
    i = tl.arange(0, N)
    offs = i[:, None] * N + i[None, :]
    c = kernels._mm(tl.load(a_ptr + offs), tl.load(b_ptr + offs), tl.float32, PREC)
    tl.store(c_ptr + offs, c)


def test_interpreted_tf32_products_drop_the_low_13_bits() -> None:
    """Under the interpreter a tf32 product of the state side takes its operands truncated to
    10 mantissa bits, as the tensor cores take float32 registers; ``ieee`` ones stay exact."""
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(16, 16, generator=g, dtype=torch.float32) for _ in range(2))

    def product(prec: str) -> np.ndarray:
        c = torch.empty(16, 16, dtype=torch.float32)
        _mm_tile[(1,)](a, b, c, N=16, PREC=prec)
        return c.double().numpy()

    def cut(x: torch.Tensor) -> np.ndarray:
        bits = x.view(torch.int32) & -8192
        return bits.view(torch.float32).double().numpy()

    def nearest(x: torch.Tensor) -> np.ndarray:
        bits = (x.view(torch.int32) + 4096) & -8192
        return bits.view(torch.float32).double().numpy()

    exact = a.double().numpy() @ b.double().numpy()
    truncated = cut(a) @ cut(b)
    rounded = nearest(a) @ nearest(b)
    tol = 16 * 2.0**-24 * (np.abs(a.double().numpy()) @ np.abs(b.double().numpy()))
    assert (np.abs(product("tf32") - truncated) <= tol).all()
    assert (np.abs(product("ieee") - exact) <= tol).all()
    # Each reading is far from the others at float32's scale: the test tells them apart.
    assert (np.abs(truncated - rounded) > tol).any() and (np.abs(truncated - exact) > tol).any()
