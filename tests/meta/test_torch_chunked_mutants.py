"""Meta-tests of the chunked algorithm (spec §5): planted bugs in its two chains are rejected.

Each mutant replaces one function of :mod:`vla_verify.backends.torch_chunked` with a copy that
has an off-by-one causal mask — the classic chunked-kernel bug — and ``validate`` must fail it.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from vla_verify import VLAConfig, backends, validate  # noqa: E402
from vla_verify.backends import torch_chunked  # noqa: E402
from vla_verify.properties.strategies import ShapeBounds  # noqa: E402

BOUNDS = ShapeBounds(max_T=40, max_dk=4, max_dv=4)


def _state_chain_reading_before_the_write(S0, K_hat, gate, V, Q):
    """``P = tril(Q Âᵀ, −1)``: the output of token t misses its own write (S_{t-1} q_t)."""
    N = torch.tril(K_hat @ gate.mT, -1)
    V_t = torch.linalg.solve_triangular(N, V, upper=False, unitriangular=True)
    K_t = torch.linalg.solve_triangular(N, K_hat, upper=False, unitriangular=True)
    P = torch.tril(Q @ gate.mT, -1)
    S, outputs = S0, []
    for c in range(V.shape[2]):
        E = V_t[:, :, c] - K_t[:, :, c] @ S.mT
        outputs.append(Q[:, :, c] @ S.mT + P[:, :, c] @ E)
        S = S + E.mT @ gate[:, :, c]
    return torch.stack(outputs, dim=2), S


def _penalty_chunk_with_gate_from_previous_A(A0, U, K_hat, floor):
    """The gate's causal mask without its diagonal: α_t from A_{t-1} instead of A_t."""
    Y = U @ A0.mT
    G = U @ Y.mT
    eye = torch.eye(G.shape[-1], dtype=G.dtype, device=G.device)
    L, d = torch_chunked._ldl(eye + torch.tril(G) + torch.tril(G, -1).mT, floor)
    W = torch.linalg.solve_triangular(L, Y, upper=False, unitriangular=True)
    W_scaled = W / d.unsqueeze(-1)
    alpha = K_hat @ A0.mT - torch.tril(K_hat @ W_scaled.mT, -1) @ W
    return alpha, A0 - W.mT @ W_scaled, d


@pytest.mark.parametrize(
    ("function", "mutant"),
    [
        ("_state_chain", _state_chain_reading_before_the_write),
        ("_penalty_chunk", _penalty_chunk_with_gate_from_previous_A),
    ],
)
def test_chunked_mutant_is_rejected(function, mutant, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = backends.get("torch_chunked", chunk_size=16)
    config = VLAConfig.exact()
    kwargs = dict(
        config=config, array="torch", dtype="float32", max_examples=40, seed=3, bounds=BOUNDS
    )
    assert validate(backend, **kwargs).passed  # the unmodified algorithm passes the same search
    monkeypatch.setattr(torch_chunked, function, mutant)
    report = validate(backend, **kwargs)
    assert not report.passed, f"{function} mutant not caught"
    assert report.failures[0].kind in ("mismatch", "carry")


def _penalty_stepwise_nudging_one_step_late(A0, U, K_hat, config, T):
    """The float64 step-by-step chain with the nudge applied after step t + 1 instead of t."""
    B, H, NC, C, dk = U.shape
    u, kh = U.reshape(B, H, NC * C, dk), K_hat.reshape(B, H, NC * C, dk)
    eye = torch.eye(dk, dtype=A0.dtype)
    A, gates = A0, []
    for t in range(T):
        s = (A @ u[:, :, t, :, None]).squeeze(-1)
        delta = torch.clamp_min(1.0 + (u[:, :, t] * s).sum(-1), config.sm_floor)
        A = A - s[..., :, None] * s[..., None, :] / delta[..., None, None]
        if t > 0 and config.nudges_at(t):
            A = A + config.nudge_eta * eye
        gates.append((A @ kh[:, :, t, :, None]).squeeze(-1))
    alpha = torch.nn.functional.pad(torch.stack(gates, dim=2), (0, 0, 0, NC * C - T))
    return alpha.reshape(B, H, NC, C, dk), A


def test_float64_stepwise_chain_mutant_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    """float64 inputs take the step-by-step penalty chain by default; a bug there is caught."""
    backend = backends.get("torch_chunked", chunk_size=16)
    kwargs = dict(
        config=VLAConfig(nudge_period=16, nudge_eta=0.5),
        array="torch",
        dtype="float64",
        max_examples=40,
        seed=3,
        bounds=ShapeBounds(max_T=40, min_T=17, max_dk=4, max_dv=4),
    )
    assert validate(backend, **kwargs).passed
    monkeypatch.setattr(torch_chunked, "_penalty_stepwise", _penalty_stepwise_nudging_one_step_late)
    report = validate(backend, **kwargs)
    assert not report.passed, "stepwise penalty-chain mutant not caught"


def _nudge_shifts_one_step_late(config, first, C, T, dtype, device):
    """The chunk's nudge schedule shifted by one step: the nudge after step t + 1 instead of t."""
    nudged = [first + i <= T and first + i >= 1 and config.nudges_at(first + i) for i in range(C)]
    if not any(nudged):
        return None
    flags = torch.tensor(nudged, dtype=dtype, device=device)
    after = flags.cumsum(0) * config.nudge_eta
    return after - flags * config.nudge_eta, after


def test_nudge_inside_a_chunk_one_step_late_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    """The paper's period 20 puts nudges inside chunks of 16; the Woodbury chain's shifted form
    (``A = B + c·I``) with the nudge one step late is caught by ``validate``."""
    backend = backends.get("torch_chunked", chunk_size=16)
    kwargs = dict(
        config=VLAConfig(nudge_period=20, nudge_eta=0.5),
        array="torch",
        dtype="float32",
        max_examples=20,
        seed=3,
        bounds=ShapeBounds(max_T=60, min_T=22, max_dk=4, max_dv=4),
    )
    assert validate(backend, **kwargs).passed
    monkeypatch.setattr(torch_chunked, "_nudge_shifts", _nudge_shifts_one_step_late)
    report = validate(backend, **kwargs)
    assert not report.passed, "nudge-one-step-late mutant not caught"
