"""VLAConfig (spec §2.2) and input checking (spec §1, §4): every bad input gets a typed error
that names the argument and what was expected."""

from __future__ import annotations

import numpy as np
import pytest

from vla_verify import VLAConfig, oracle
from vla_verify.errors import (
    ConfigError,
    DTypeError,
    NonFiniteError,
    ShapeError,
    UnknownVariantError,
    VLAInputError,
)


def test_default_is_the_paper_preset() -> None:
    c = VLAConfig()
    assert (c.lambda0, c.sm_floor, c.nudge_eta, c.nudge_period) == (0.1, 1e-4, 1e-3, 20)
    assert c.normalize_gate and c.normalize_output
    assert (c.out_eps, c.norm_eps) == (1e-4, 1e-12)


def test_exact_is_the_preset_without_nudges() -> None:
    assert VLAConfig.exact() == VLAConfig(nudge_period=None)
    assert VLAConfig.exact(lambda0=2.0).lambda0 == 2.0


def test_config_is_frozen() -> None:
    with pytest.raises(AttributeError):
        VLAConfig().lambda0 = 1.0  # type: ignore[misc]


def test_nudges_at_global_steps() -> None:
    c = VLAConfig(nudge_period=3)
    assert [t for t in range(1, 10) if c.nudges_at(t)] == [3, 6, 9]
    assert not any(VLAConfig.exact().nudges_at(t) for t in range(1, 50))


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("lambda0", 0.0, "> 0"),
        ("lambda0", -1.0, "> 0"),
        ("lambda0", float("nan"), "finite"),
        ("lambda0", float("inf"), "finite"),
        ("lambda0", "0.1", "real number"),
        ("sm_floor", -1e-4, "> 0"),
        ("sm_floor", 0.0, "> 0"),
        ("nudge_eta", -1.0, ">= 0"),
        ("out_eps", 0.0, "> 0"),
        ("out_eps", -1.0, "> 0"),
        ("norm_eps", 0.0, "> 0"),
        ("nudge_period", 2.5, "positive integer"),
        ("nudge_period", 0, "positive integer"),
        ("nudge_period", True, "positive integer"),
        ("normalize_gate", 1, "True or False"),
        ("normalize_output", "yes", "True or False"),
    ],
)
def test_bad_config_field_is_named(field: str, value: object, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        VLAConfig(**{field: value})
    assert info.value.argument == field
    assert field in str(info.value) and expected in str(info.value)
    assert isinstance(info.value, ValueError)


def _inputs(B=1, T=3, H=2, dk=4, dv=3, dtype=np.float64):
    rng = np.random.default_rng(0)
    q, k, u = (rng.standard_normal((B, T, H, dk)).astype(dtype) for _ in range(3))
    v = rng.standard_normal((B, T, H, dv)).astype(dtype)
    return q, k, v, u


@pytest.mark.parametrize(
    ("mutate", "argument", "expected"),
    [
        (lambda a: a.update(q=a["q"][0]), "q", "rank 4"),
        (lambda a: a.update(k=a["k"][:, :2]), "k", "shape of q"),
        (lambda a: a.update(u=a["u"][..., :3]), "u", "shape of q"),
        (lambda a: a.update(v=a["v"][:, :, :1]), "v", "(dv,)"),
        (lambda a: a.update(v=[[1.0]]), "v", "expected an array"),
        (
            lambda a: a.update(q=a["q"][:, :0], k=a["k"][:, :0], u=a["u"][:, :0], v=a["v"][:, :0]),
            "q",
            ">= 1",
        ),
    ],
)
def test_shape_errors_name_the_argument(mutate, argument: str, expected: str) -> None:
    args = dict(zip("qkvu", _inputs(), strict=True))
    mutate(args)
    with pytest.raises(ShapeError) as info:
        oracle.recurrence(args["q"], args["k"], args["v"], args["u"])
    assert info.value.argument == argument
    assert expected in str(info.value)


def test_non_float_and_mixed_dtypes() -> None:
    q, k, v, u = _inputs()
    with pytest.raises(DTypeError, match=r"^q: expected a float dtype"):
        oracle.recurrence(q.astype(np.int64), k, v, u)
    with pytest.raises(DTypeError, match=r"^k: expected dtype float64 \(the dtype of q\)"):
        oracle.recurrence(q, k.astype(np.float32), v, u)
    with pytest.raises(DTypeError, match=r"^v: expected a float dtype.*complex128"):
        oracle.recurrence(q, k, v.astype(np.complex128), u)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("name", ["q", "k", "v", "u"])
def test_non_finite_inputs_are_refused(name: str, bad: float) -> None:
    args = dict(zip("qkvu", _inputs(), strict=True))
    args[name] = args[name].copy()
    args[name][0, 1, 0, 0] = bad
    with pytest.raises(NonFiniteError) as info:
        oracle.recurrence(**args)
    assert info.value.argument == name and "NaN or Inf" in str(info.value)


def test_initial_state_is_checked() -> None:
    q, k, v, u = _inputs(B=2, H=2, dk=4, dv=3)
    S, A, z = np.zeros((2, 2, 3, 4)), np.eye(4) * np.ones((2, 2, 1, 1)), np.zeros((2, 2, 4))
    with pytest.raises(ShapeError, match=r"initial_state.S: expected shape \(2, 2, 3, 4\)"):
        oracle.recurrence(q, k, v, u, initial_state=(S.swapaxes(-1, -2), A, z))
    with pytest.raises(ShapeError, match=r"initial_state: expected a tuple \(S, A, z\)"):
        oracle.recurrence(q, k, v, u, initial_state=(S, A))
    bad_A = A.copy()
    bad_A[0, 0, 0, 0] = np.nan
    with pytest.raises(NonFiniteError, match=r"initial_state.A"):
        oracle.recurrence(q, k, v, u, initial_state=(S, bad_A, z))


def test_a_wider_state_is_taken_only_where_the_caller_allows_it() -> None:
    """``check_inputs(state_dtypes=...)``: each state array may have q's dtype or one of them;
    the inputs keep one dtype, and without ``state_dtypes`` the state keeps q's."""
    from vla_verify.spec import check_inputs

    q, k, v, u = _inputs(dtype=np.float16)
    S = np.zeros((1, 2, 3, 4), np.float32)
    A = np.broadcast_to(np.eye(4, dtype=np.float32), (1, 2, 4, 4)).copy()
    z = np.zeros((1, 2, 4), np.float16)  # one entry in q's dtype: each is checked alone
    assert tuple(check_inputs(q, k, v, u, (S, A, z), state_dtypes=("float32",))) == (1, 3, 2, 4, 3)
    with pytest.raises(DTypeError, match=r"^initial_state.S: expected dtype float16 \(the dtype "
                       r"of q\), got float32$"):  # fmt: skip
        check_inputs(q, k, v, u, (S, A, z))
    with pytest.raises(DTypeError, match=r"^initial_state.A: .* or one of \('float32',\), got "
                       r"float64$"):  # fmt: skip
        check_inputs(q, k, v, u, (S, A.astype(np.float64), z), state_dtypes=("float32",))
    with pytest.raises(DTypeError, match=r"^k: expected dtype float16 \(the dtype of q\), got"):
        check_inputs(q, k.astype(np.float32), v, u, state_dtypes=("float32",))


def test_unknown_variant() -> None:
    with pytest.raises(UnknownVariantError, match=r"variant: expected one of .*'vla'.*got 'gla'"):
        oracle.recurrence(*_inputs(), variant="gla")


def test_rls_refuses_nudges_with_the_reason() -> None:
    with pytest.raises(ConfigError, match=r"config.nudge_period: .*VLAConfig.exact\(\)"):
        oracle.recurrence(*_inputs(), variant="rls", config=VLAConfig())


def test_every_input_error_is_a_value_error() -> None:
    for cls in (ConfigError, ShapeError, DTypeError, NonFiniteError, UnknownVariantError):
        assert issubclass(cls, VLAInputError) and issubclass(cls, ValueError)


def test_all_finite_fast_path_never_hides_a_nan_and_survives_an_overflowing_sum() -> None:
    import numpy as np

    from vla_verify.spec import _all_finite

    big = np.full(8, 6e4, dtype=np.float16)  # finite, but the float16 sum overflows
    assert _all_finite(big)
    for bad in (np.nan, np.inf, -np.inf):
        x = np.ones(8, dtype=np.float32)
        x[3] = bad
        assert not _all_finite(x)
    torch = pytest.importorskip("torch")
    assert _all_finite(torch.full((8,), 3e38))  # the float32 sum is inf
    t = torch.ones(8)
    t[5] = float("nan")
    assert not _all_finite(t)


@pytest.mark.parametrize("field", ["nudge_period", "nudge_eta"])
def test_exact_takes_no_nudge_arguments(field: str) -> None:
    with pytest.raises(ConfigError) as info:
        VLAConfig.exact(**{field: 5})
    assert info.value.argument == field and "without nudges" in str(info.value)
    assert VLAConfig.exact(nudge_period=None).nudge_period is None


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda: VLAConfig(lamda0=1.0), "lamda0"),
        (lambda: VLAConfig(*range(1, 10)), "config"),
        (lambda: VLAConfig(0.1, lambda0=0.2), "lambda0"),
        (lambda: VLAConfig().replace(nudges=3), "nudges"),
        (lambda: VLAConfig.exact(eps=1), "eps"),
        (lambda: VLAConfig(lambda0=1 + 2j), "lambda0"),
        (lambda: VLAConfig(nudge_period=None, nudge_eta=float("nan")), "nudge_eta"),
    ],
)
def test_config_errors_are_typed_and_named(call, argument: str) -> None:
    with pytest.raises(ConfigError) as info:
        call()
    assert info.value.argument == argument


def test_check_config_refuses_what_is_not_a_config() -> None:
    from vla_verify.spec import check_config

    assert check_config(None) == VLAConfig()
    config = VLAConfig(lambda0=2.0)
    assert check_config(config) is config
    with pytest.raises(ConfigError, match=r"config: expected a VLAConfig or None, got dict"):
        check_config({"lambda0": 0.1})
    with pytest.raises(ConfigError) as info:
        oracle.recurrence(*_inputs(), config={"lambda0": 0.1})
    assert info.value.argument == "config"
