"""Fuzz every public entry point: each call returns a correct result or raises a VLAError.

Hypothesis draws arrays of any shape, rank and dtype (ints, complex, bool, object included), NaN,
Inf and huge values, Python lists and scalars; configurations valid and invalid (dicts, strings,
None); variants and ``start`` values of every type.  It calls the backends ``numpy``, ``mpmath``,
``torch`` and ``torch_chunked``, :func:`vla_verify.oracle.reference`, ``VLAConfig(...)`` and
``VLAConfig.exact(...)``, and asserts that each call either

- raises a :class:`~vla_verify.errors.VLAError` subclass (any other exception fails the test), or
- returns a result of the requested shapes and dtype, finite, and within the error model of
  :mod:`vla_verify.error_model` of :func:`~vla_verify.oracle.reference` (the reference itself is
  checked against mpmath at 100 digits): never a silently wrong number.  Where the reference
  cannot vouch for the case (``IllConditionedError``) the result is counted as beyond it.

The counts of calls and outcomes are printed at the end of the module (``pytest -s``) and written
to ``vla-verify-report/fuzz_entry_points.json``.  Short under the ``ci`` profile, long under
``thorough``.
"""

from __future__ import annotations

import collections
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from vla_verify import VLAConfig, backends, oracle
from vla_verify.error_model import compare
from vla_verify.errors import IllConditionedError, VLAError
from vla_verify.spec import VARIANTS
from vla_verify.validation import same_precision_runs

COUNTS: collections.Counter[str] = collections.Counter()
FIELDS = [
    "lambda0",
    "sm_floor",
    "nudge_eta",
    "nudge_period",
    "normalize_gate",
    "normalize_output",
    "out_eps",
    "norm_eps",
]
#: Four times the profile's examples per entry point: ~10 s in all under ``ci``, ~10 min under
#: ``thorough``.
FUZZ = settings(
    max_examples=4 * settings.default.max_examples,
    suppress_health_check=list(HealthCheck),
    deadline=None,
)


@pytest.fixture(scope="module", autouse=True)
def _summary() -> Any:
    yield
    out = Path("vla-verify-report")
    out.mkdir(exist_ok=True)
    data = {"calls": sum(v for k, v in COUNTS.items() if k.endswith(":calls")), **COUNTS}
    (out / "fuzz_entry_points.json").write_text(json.dumps(dict(sorted(data.items())), indent=1))
    print(f"\nfuzz entry points: {json.dumps(dict(sorted(data.items())))}")


# -- what is drawn ---------------------------------------------------------------------------

_JUNK_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    st.floats(allow_nan=True, allow_infinity=True),
    st.complex_numbers(max_magnitude=10),
    st.text(max_size=3),
)


@st.composite
def _sizes(draw: st.DrawFn) -> tuple[int, int, int, int, int]:
    return (
        draw(st.integers(1, 2)),
        draw(st.integers(1, 6)),
        draw(st.integers(1, 2)),
        draw(st.integers(1, 4)),
        draw(st.integers(1, 3)),
    )


@st.composite
def _values(draw: st.DrawFn, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Floats of a drawn scale: ordinary (1e-3 … 1e3), or huge (up to 1e150)."""
    huge = draw(st.integers(0, 9), label="huge") == 0
    exponent = draw(st.floats(3, 150) if huge else st.floats(-3, 3), label="scale")
    return rng.standard_normal(shape) * 10.0**exponent


def _corrupt(draw: st.DrawFn, x: np.ndarray) -> Any:
    kind = draw(
        st.sampled_from(
            [
                "rank",
                "shape",
                "int",
                "complex",
                "bool",
                "object",
                "nan",
                "inf",
                "list",
                "none",
                "scalar",
                "empty",
            ]
        ),
        label="corruption",
    )
    if kind == "rank":
        return x.reshape(-1)
    if kind == "shape":
        return np.concatenate([x, x], axis=-1)
    if kind == "int":
        return x.astype(np.int64)
    if kind == "complex":
        return x.astype(np.complex128)
    if kind == "bool":
        return x > 0
    if kind == "object":
        return x.astype(object)
    if kind in ("nan", "inf"):
        y = x.astype(np.float64).copy()
        y.flat[draw(st.integers(0, y.size - 1))] = np.nan if kind == "nan" else -np.inf
        return y
    if kind == "list":
        return x.tolist()
    if kind == "none":
        return None
    if kind == "scalar":
        return 1.0
    return x[:, :0]


@st.composite
def requests(draw: st.DrawFn, torch_dtypes: bool = False) -> dict[str, Any]:
    """One call's arguments, valid or not: ``q, k, v, u, config, variant, initial_state,
    start, dtype``."""
    B, T, H, dk, dv = draw(_sizes())
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="seed"))
    arrays = {
        name: draw(_values((B, T, H, dv if name == "v" else dk), rng))
        for name in ("q", "k", "v", "u")
    }
    arrays["q"] = np.abs(arrays["q"]) if draw(st.booleans()) else arrays["q"]
    dtypes = ["float64", "float32"] + (["bfloat16", "float16"] if torch_dtypes else ["float16"])
    dtype = draw(st.sampled_from(dtypes), label="dtype")
    if draw(st.integers(0, 4), label="corrupt?") == 4:
        name = draw(st.sampled_from(sorted(arrays)))
        arrays[name] = _corrupt(draw, arrays[name])
    state_kind = draw(st.sampled_from(["none", "spd", "none", "spd", "junk"]), label="state")
    state: Any = None
    if state_kind == "spd":
        G = rng.standard_normal((B, H, dk, dk))
        state = (
            rng.standard_normal((B, H, dv, dk)),
            np.einsum("bhij,bhkj->bhik", G, G) + 0.1 * np.eye(dk),
            np.abs(rng.standard_normal((B, H, dk))) + 1.0,
        )
    elif state_kind == "junk":
        state = draw(
            st.sampled_from(
                [
                    (np.zeros((B, H, dv, dk)), np.zeros((B, H, dk, dk))),
                    (np.zeros((B, H, dk, dv)), np.eye(dk)[None, None], np.zeros((B, H, dk))),
                    "state",
                    [1, 2, 3],
                ]
            )
        )
    valid_config = st.one_of(
        st.builds(
            VLAConfig,
            lambda0=st.floats(1e-2, 10),
            nudge_period=st.one_of(st.none(), st.integers(1, 7)),
            normalize_gate=st.booleans(),
            normalize_output=st.booleans(),
        ),
        st.none(),
        st.builds(VLAConfig.exact, lambda0=st.floats(1e-2, 10)),
    )
    junk_config = st.one_of(
        st.dictionaries(st.sampled_from(FIELDS), _JUNK_VALUES, max_size=2), _JUNK_VALUES
    )
    # Four draws in five are valid, so that most calls reach the computation.
    config = draw(
        valid_config if draw(st.integers(0, 4), label="config?") < 4 else junk_config,
        label="config",
    )
    variant = draw(
        st.sampled_from(VARIANTS)
        if draw(st.integers(0, 4), label="variant?") < 4
        else st.one_of(st.sampled_from(["gla", "", "VLA"]), _JUNK_VALUES),
        label="variant",
    )
    start = draw(
        st.integers(0, 50)
        if draw(st.integers(0, 4), label="start?") < 4
        else st.one_of(st.integers(-3, -1), _JUNK_VALUES),
        label="start",
    )
    return dict(
        **arrays, config=config, variant=variant, initial_state=state, start=start, dtype=dtype
    )


# -- what is checked -------------------------------------------------------------------------


def _as(x: Any, library: str, dtype: str) -> Any:
    """A float array as the library's array of ``dtype``; anything else as drawn."""
    if not isinstance(x, np.ndarray) or x.dtype.kind != "f":
        if library == "torch" and isinstance(x, np.ndarray) and x.dtype.kind in "iub":
            import torch

            return torch.from_numpy(x)
        return x
    if library == "numpy":
        return x.astype(dtype)
    import torch

    return torch.tensor(x, dtype=getattr(torch, dtype))


def _float64(x: Any) -> np.ndarray:
    from vla_verify.arrays import to_numpy

    return to_numpy(x)


def _check_result(name: str, req: dict[str, Any], out: Any, dtype: str) -> None:
    """Shapes, dtype, finiteness, and agreement with the reference within the error model."""
    from vla_verify.spec import dtype_name

    o, (S, A, z) = out
    B, T, H, dk = np.shape(req["q"])
    dv = np.shape(req["v"])[-1]
    want = {"o": (B, T, H, dv), "S": (B, H, dv, dk), "A": (B, H, dk, dk), "z": (B, H, dk)}
    for part, x in zip("oSAz", (o, S, A, z), strict=True):
        assert tuple(x.shape) == want[part], f"{name}: {part} has shape {tuple(x.shape)}"
        assert dtype_name(x) == dtype, f"{name}: {part} is {dtype_name(x)}, asked for {dtype}"
        assert np.all(np.isfinite(_float64(x))), f"{name}: non-finite {part} returned silently"
    library = "numpy" if dtype != "bfloat16" else "torch"
    inputs = [_float64(_as(req[n], library, dtype)) for n in "qkvu"]
    state = req["initial_state"]
    state64 = None if state is None else tuple(_float64(_as(x, library, dtype)) for x in state)
    kwargs = dict(config=req["config"], variant=req["variant"], initial_state=state64)
    try:
        ref = oracle.reference(*inputs, start=req["start"], **kwargs)
    except IllConditionedError:
        COUNTS[f"{name}:beyond_reference"] += 1
        return
    got = (_float64(o), tuple(_float64(x) for x in (S, A, z)))
    rel = oracle._disagreement(got, (ref.o, ref.state))
    if name == "mpmath":
        # It re-runs at more digits wherever float64 loses more than 1e-6: 1e-10 or an error.
        assert rel <= 1e-10, f"mpmath off the reference by {rel:.3g}: a silently wrong number"
        COUNTS[f"{name}:correct"] += 1
        return
    raw = oracle.recurrence(*inputs, start=req["start"], diagnose=True, **kwargs)
    estimate = raw.diagnostics.estimate
    if name == "numpy" and dtype == "float64":
        # The float64 oracle's own guarantee: within 20 times its estimate.
        assert rel <= 20 * estimate + 1e-15, (
            f"numpy off the reference by {rel:.3g}, estimate {estimate:.3g}: silently wrong"
        )
        COUNTS[f"{name}:correct"] += 1
        return
    runs = same_precision_runs(
        inputs, state64, config=req["config"] or VLAConfig(), variant=req["variant"], dtype=dtype
    )
    if req["start"]:
        # same_precision_runs counts the clock from 0; with a shifted clock take one run.
        runs = [
            oracle.recurrence(
                *inputs,
                start=req["start"],
                dtype="float32" if dtype == "float64" else dtype,
                **kwargs,
            )
        ]
    history = oracle.recurrence(*inputs, start=req["start"], return_states=True, **kwargs).history
    scale_A = np.max(np.abs(history.A), axis=(1, 3, 4))
    if state64 is not None:
        scale_A = np.maximum(scale_A, np.max(np.abs(state64[1]), axis=(2, 3)))
    terms = dk + (T if name == "torch_chunked" else 0)
    for part, x, truth, base, scale in (
        ("o", o, ref.o, [r.o for r in runs], None),
        ("S", S, ref.state[0], [r.state[0] for r in runs], None),
        ("A", A, ref.state[1], [r.state[1] for r in runs], scale_A),
        ("z", z, ref.state[2], [r.state[2] for r in runs], None),
    ):
        if not all(np.all(np.isfinite(b)) for b in base):
            COUNTS[f"{name}:outside_envelope"] += 1
            return
        c = compare(part, _float64(x), truth, base, dtype, scale=scale, terms=terms)
        # A float64 kernel may be as far off as the float64 oracle itself (3 x its bound): the
        # error model's float64 budget is a first-order model of that.
        as_good_as_float64 = dtype == "float64" and rel <= 3 * 20 * estimate
        assert c.passed or as_good_as_float64, (
            f"{name}: {part} off the reference by {c.error.max():.3g} > budget "
            f"{c.budget.max():.3g} ({ref.method}): a silently wrong number"
        )
    COUNTS[f"{name}:correct"] += 1


def _call_backend(name: str, req: dict[str, Any]) -> None:
    COUNTS[f"{name}:calls"] += 1
    library = "torch" if name.startswith("torch") else "numpy"
    dtype = req["dtype"]
    args = [_as(req[n], library, dtype) for n in "qkvu"]
    state = req["initial_state"]
    if isinstance(state, tuple):
        state = tuple(_as(x, library, dtype) for x in state)
    try:
        backend = backends.get(name, variant=req["variant"])
        out = backend(*args, config=req["config"], initial_state=state, start=req["start"])
    except VLAError as exc:
        COUNTS[f"{name}:error:{type(exc).__name__}"] += 1
        return
    _check_result(name, req, out, dtype)


@pytest.mark.parametrize("name", ["numpy", "mpmath", "torch", "torch_chunked"])
def test_backends_return_the_right_answer_or_a_typed_error(name: str) -> None:
    from hypothesis import given

    if name.startswith("torch"):
        pytest.importorskip("torch")

    @FUZZ
    @given(req=requests(torch_dtypes=name.startswith("torch")))
    def run(req: dict[str, Any]) -> None:
        _call_backend(name, req)

    run()


def test_reference_is_right_or_says_it_cannot_be() -> None:
    from hypothesis import given

    @FUZZ
    @given(req=requests())
    def run(req: dict[str, Any]) -> None:
        COUNTS["reference:calls"] += 1
        args = [_as(req[n], "numpy", req["dtype"]) for n in "qkvu"]
        try:
            ref = oracle.reference(
                *args,
                config=req["config"],
                variant=req["variant"],
                initial_state=req["initial_state"],
                start=req["start"],
            )
        except VLAError as exc:
            COUNTS[f"reference:error:{type(exc).__name__}"] += 1
            return
        assert all(np.all(np.isfinite(x)) for x in (ref.o, *ref.state))
        inputs = [_float64(x) for x in args]
        state = req["initial_state"]
        truth = oracle.recurrence_mp(
            *inputs,
            config=req["config"],
            variant=req["variant"],
            initial_state=None if state is None else tuple(_float64(x) for x in state),
            start=req["start"],
            dps=100 if ref.method == "float64" else 400,
        )
        rel = oracle._disagreement((ref.o, ref.state), truth)
        assert rel <= oracle.DEFAULT_TARGET_RTOL, (
            f"reference ({ref.method}, estimate {ref.error_estimate:.3g}) off mpmath by {rel:.3g}"
        )
        COUNTS[f"reference:correct:{ref.method.split('(')[0]}"] += 1

    run()


@pytest.mark.parametrize("constructor", ["VLAConfig", "VLAConfig.exact"])
def test_config_constructors_validate_every_field(constructor: str) -> None:
    from hypothesis import given

    make = VLAConfig if constructor == "VLAConfig" else VLAConfig.exact
    names = st.sampled_from([*FIELDS, "lambda", "nudges", "eps"])
    values = st.one_of(st.floats(1e-3, 10), st.integers(1, 30), st.booleans(), _JUNK_VALUES)
    positional = st.one_of(st.just([]), st.lists(values, max_size=9))

    @FUZZ
    @given(kwargs=st.dictionaries(names, values, max_size=4), args=positional)
    def run(kwargs: dict[str, Any], args: list[Any]) -> None:
        COUNTS[f"{constructor}:calls"] += 1
        try:
            config = make(*args, **kwargs) if constructor == "VLAConfig" else make(**kwargs)
        except VLAError as exc:
            COUNTS[f"{constructor}:error:{type(exc).__name__}"] += 1
            return
        for f in ("lambda0", "sm_floor", "out_eps", "norm_eps"):
            value = getattr(config, f)
            assert isinstance(value, float) and math.isfinite(value) and value > 0, (f, value)
        assert isinstance(config.nudge_eta, float) and config.nudge_eta >= 0
        period = config.nudge_period
        assert period is None or (type(period) is int and period >= 1)
        assert type(config.normalize_gate) is bool and type(config.normalize_output) is bool
        if constructor == "VLAConfig.exact":
            assert period is None
        COUNTS[f"{constructor}:valid"] += 1

    run()
