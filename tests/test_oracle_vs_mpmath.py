"""The float64 oracle against the mpmath backend (50 digits): the oracle's own error.

Two statements:

1. On well-conditioned random inputs, every variant agrees with mpmath to a relative error
   ≤ 1e-12.
2. The error model that ``validate`` uses for float64 implementations
   (:mod:`vla_verify.error_model`: ``err_64 ≈ (u_64/u_32)·err_32``) bounds the oracle's true
   error, measured against mpmath, on the hard corners the strategies draw.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings

from vla_verify import VLAConfig, backends, oracle
from vla_verify.error_model import DEFAULT_FACTOR, compare
from vla_verify.properties.strategies import Case, ShapeBounds, cases
from vla_verify.validation import same_precision_runs, validate

CONFIGS = {
    "vla": VLAConfig(nudge_period=4),
    "rls": VLAConfig.exact(),
    "delta": VLAConfig(),
    "linear": VLAConfig(),
}


def _well_conditioned(seed: int, B=2, T=12, H=2, dk=3, dv=2):
    rng = np.random.default_rng(seed)
    q = np.exp(rng.standard_normal((B, T, H, dk)))  # positive: z·q is far from the floor
    k = np.exp(rng.standard_normal((B, T, H, dk)))
    u = rng.standard_normal((B, T, H, dk)) / np.sqrt(dk)
    v = rng.standard_normal((B, T, H, dv))
    return q, k, v, u


@pytest.mark.parametrize("variant", ["vla", "rls", "delta", "linear"])
def test_float64_oracle_agrees_with_mpmath(variant: str) -> None:
    args = _well_conditioned(seed=7)
    config = CONFIGS[variant]
    ref = oracle.recurrence_mp(*args, config=config, variant=variant, dps=50)
    got = oracle.recurrence(*args, config=config, variant=variant)
    for name, x, y in zip(
        ("o", "S", "A", "z"), (got.o, *got.state), (ref[0], *ref[1]), strict=True
    ):
        rel = np.max(np.abs(x - y)) / np.max(np.abs(y))
        assert rel <= 1e-12, f"{variant} {name}: relative error {rel:.2e} > 1e-12"


def test_penalty_inverse_agrees_with_mpmath() -> None:
    _, _, _, u = _well_conditioned(seed=2, T=8)
    direct = oracle.penalty_inverse(u, 0.1)
    certified = oracle.penalty_inverse_mp(u, 0.1)
    assert np.max(np.abs(direct - certified)) / np.max(np.abs(certified)) <= 1e-13


@settings(max_examples=30)
@given(
    case=cases(
        VLAConfig(nudge_period=5), ShapeBounds(max_B=1, max_H=2, max_T=16, max_dk=4, max_dv=3)
    )
)
def test_error_model_bounds_the_float64_oracle(case: Case) -> None:
    """|oracle_64 − mpmath| ≤ (factor + 1)·(u_64/u_32)·|oracle_32 − oracle_64| + floor, per slice:
    the float64 budget of spec §4 holds for the oracle itself when the truth is known."""
    config = VLAConfig(nudge_period=5)
    args = (case.q, case.k, case.v, case.u)
    r64 = oracle.recurrence(
        *args, config=config, initial_state=case.initial_state, return_states=True
    )
    runs32 = same_precision_runs(
        args, case.initial_state, config=config, variant="vla", dtype="float64", seed=case.seed
    )
    if not all(np.all(np.isfinite(x)) for r in runs32 for x in (r.o, *r.state, r64.o)):
        return  # outside float32's envelope: the model has nothing to say
    o_mp, state_mp = oracle.recurrence_mp(*args, config=config, initial_state=case.initial_state)
    scale_A = np.max(np.abs(r64.history.A), axis=(1, 3, 4))
    if case.initial_state is not None:
        scale_A = np.maximum(scale_A, np.max(np.abs(case.initial_state[1]), axis=(2, 3)))
    # Note the roles: mpmath is the reference, the float64 oracle is the implementation, and the
    # float32 oracle (compared with mpmath) measures the example's condition factor.
    for name, got, truth, base, scale in (
        ("o", r64.o, o_mp, [r.o for r in runs32], None),
        ("A", r64.state[1], state_mp[1], [r.state[1] for r in runs32], scale_A),
    ):
        c = compare(name, got, truth, base, "float64", factor=DEFAULT_FACTOR, scale=scale)
        assert c.passed, f"{name}: error {c.error.max():.3e} > budget {c.budget.max():.3e}"


def test_mpmath_backend_passes_validate_and_refuses_large_requests() -> None:
    report = validate(
        backends.get("mpmath"),
        max_examples=8,
        seed=0,
        bounds=ShapeBounds(max_B=1, max_H=1, max_T=12, max_dk=3, max_dv=2),
    )
    assert report.passed, report.summary()
    small = backends.get("mpmath", max_work=10)
    from vla_verify.spec import Shapes

    reason = small.check_support(VLAConfig(), Shapes(1, 10, 1, 4, 4), "float64")
    assert reason is not None and "max_work=10" in reason


def test_closed_forms_agree_with_mpmath() -> None:
    _, k, v, u = _well_conditioned(seed=4, B=1, T=6, H=2, dk=3, dv=2)
    direct = oracle.argmin_state(k, v, u, 0.1)
    certified = oracle.argmin_state_mp(k, v, u, 0.1)
    assert np.max(np.abs(direct - certified)) / np.max(np.abs(certified)) <= 1e-12
    rng = np.random.default_rng(0)
    a, g = rng.standard_normal(4), rng.standard_normal(4)
    a, g = a / np.linalg.norm(a), g / np.linalg.norm(g)
    np.testing.assert_allclose(
        oracle.jacobian_spectral_norm(a, g, 3), oracle.jacobian_spectral_norm_mp(a, g), rtol=1e-14
    )


# -- the reference (oracle.reference): escalation where float64 loses its digits -------------


def _strongly_penalised(scale: float, seed: int = 0, T: int = 6, dk: int = 3, dv: int = 2):
    """Six tokens whose penalties have norm ``scale``: the Sherman–Morrison downdate subtracts
    numbers of size ``1/lambda0`` to make numbers of size ``1/scale²``."""
    rng = np.random.default_rng(seed)
    q = np.exp(rng.standard_normal((1, T, 1, dk)))
    k = np.exp(rng.standard_normal((1, T, 1, dk)))
    v = rng.standard_normal((1, T, 1, dv))
    u = rng.standard_normal((1, T, 1, dk)) * scale
    return q, k, v, u


def _rel(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))


def test_float64_is_silently_wrong_on_the_six_token_problem() -> None:
    """The known case: ||u|| ~ 1e8.  The raw float64 recurrence is percent-level off and its A
    is indefinite (an eigenvalue ~ -1e3 where the truth is +1e-17): what the reference must
    not return."""
    args = _strongly_penalised(1e8)
    config = VLAConfig.exact()
    raw = oracle.recurrence(*args, config=config)
    o_mp, (_, A_mp, _) = oracle.recurrence_mp(*args, config=config, dps=500)
    assert _rel(raw.o, o_mp) > 1e-2
    assert np.linalg.eigvalsh(raw.state[1]).min() < -1.0
    assert 0 < np.linalg.eigvalsh(A_mp).min() < 1e-15


@pytest.mark.parametrize("scale", [1e4, 1e8, 1e100])
def test_reference_escalates_to_the_right_answer(scale: float) -> None:
    args = _strongly_penalised(scale)
    config = VLAConfig.exact()
    ref = oracle.reference(*args, config=config)
    o_mp, state_mp = oracle.recurrence_mp(*args, config=config, dps=500)
    assert ref.method.startswith("mpmath(")
    assert _rel(ref.o, o_mp) <= oracle.DEFAULT_TARGET_RTOL
    for got, want in zip(ref.state, state_mp, strict=True):
        assert _rel(got, want) <= oracle.DEFAULT_TARGET_RTOL
    assert ref.error_estimate <= oracle.DEFAULT_TARGET_RTOL


@pytest.mark.parametrize("scale", [1e8, 1e100])
def test_reference_refuses_when_too_large_to_escalate(scale: float) -> None:
    from vla_verify.errors import IllConditionedError

    with pytest.raises(IllConditionedError) as info:
        oracle.reference(*_strongly_penalised(scale), config=VLAConfig.exact(), max_work=0)
    err = info.value
    assert err.step is not None and 1 <= err.step <= 6
    assert err.figure in ("gate", "floor", "nonfinite", "memory")
    assert err.estimate > oracle.DEFAULT_TARGET_RTOL
    assert f"step {err.step}" in str(err) and "max_work=0" in str(err)


def test_reference_keeps_float64_on_ordinary_inputs() -> None:
    args = _well_conditioned(seed=3)
    ref = oracle.reference(*args, config=VLAConfig())
    raw = oracle.recurrence(*args, config=VLAConfig())
    assert ref.method == "float64"
    np.testing.assert_array_equal(ref.o, raw.o)
    assert 0 < ref.error_estimate <= 1e-12


@pytest.mark.parametrize("variant", ["vla", "rls", "delta", "linear"])
def test_reference_does_not_escalate_well_conditioned_cases(variant: str) -> None:
    """The false-alarm rate on the strategies' ordinary regimes (layer/gaussian penalties, no or
    an SPD initial state) is zero: the estimate fires only where digits are lost."""
    config = CONFIGS[variant]
    methods: list[str] = []

    @settings(max_examples=15, deadline=None)
    @given(
        case=cases(
            config,
            ShapeBounds(max_B=2, max_H=2, max_T=32, max_dk=6, max_dv=4),
            penalty_regimes=("layer", "gaussian"),
            key_regimes=("gaussian", "positive"),
            value_regimes=("gaussian",),
            query_regimes=("positive",),
            state_regimes=("none", "spd"),
        )
    )
    def run(case: Case) -> None:
        ref = oracle.reference(
            case.q,
            case.k,
            case.v,
            case.u,
            config=config,
            variant=variant,
            initial_state=case.initial_state,
            max_work=0,
        )
        methods.append(ref.method)

    run()
    assert methods and set(methods) == {"float64"}


def test_reference_history_is_float64_on_ordinary_inputs_and_escalates_elsewhere() -> None:
    """``oracle.reference_history``: the float64 history where the estimate vouches for it;
    on the strongly penalised case every step's state is the 500-digit one; a history too large
    to escalate prefix by prefix raises, naming the work."""
    from vla_verify.errors import ConfigError, IllConditionedError

    args = _well_conditioned(seed=3)
    plain = oracle.reference_history(*args, config=VLAConfig())
    raw = oracle.recurrence(*args, config=VLAConfig(), return_states=True)
    assert plain.method == "float64" and raw.history is not None
    np.testing.assert_array_equal(plain.S, raw.history.S)
    np.testing.assert_array_equal(plain.o, raw.o)
    hard = _strongly_penalised(1e8)
    config = VLAConfig.exact()
    h = oracle.reference_history(*hard, config=config)
    assert h.method == "reference of every prefix"
    for t in (1, 4, 6):
        o_mp, (S_mp, A_mp, z_mp) = oracle.recurrence_mp(
            *(x[:, :t] for x in hard), config=config, dps=500
        )
        assert _rel(h.o[:, t - 1], o_mp[:, t - 1]) <= oracle.DEFAULT_TARGET_RTOL
        for got, want in ((h.S, S_mp), (h.A, A_mp), (h.z, z_mp)):
            assert _rel(got[:, t - 1], want) <= oracle.DEFAULT_TARGET_RTOL
    # B·H·dk·(dk + dv)·T(T + 1)/2 = 15·21 = 315 for this case.
    with pytest.raises(IllConditionedError, match="max_work=314"):
        oracle.reference_history(*hard, config=config, max_work=314)
    with pytest.raises(ConfigError, match="target_rtol"):
        oracle.reference_history(*hard, config=config, target_rtol=0.0)
