"""``validate`` (spec §4): it accepts correct implementations and rejects planted bugs.

The meta-tests below are the checker's own tests: each mutant in ``tests/mutants.py`` plants one
bug of a kind real kernels have had, and ``validate`` must reject it with a shrunk
counterexample.  The correct implementation there is written independently of the oracle.
"""

from __future__ import annotations

import numpy as np
import pytest
from mutants import MUTANTS, make

from vla_verify import VLAConfig, backends, validate
from vla_verify.errors import (
    DTypeError,
    UnknownVariantError,
    UnsupportedConfigurationError,
    VLAInputError,
)
from vla_verify.properties.strategies import ShapeBounds
from vla_verify.validation import carry_cut

SEED = 20261130
#: The property tests' small sizes: these tests are about formulas and reports, not reach
#: (tests/meta/test_checker_reach.py checks the default sizes).
SMALL = ShapeBounds()
#: For implementations that fail on every input (wrong types, shapes, dtypes, devices, crashes):
#: what is checked is the failure's kind and message, which any size shows, while the shrinker
#: runs the reference on every candidate it tries, so small sizes keep these tests fast.
TOY = ShapeBounds(max_B=1, max_H=1, max_T=6, max_dk=2, max_dv=2)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_accepts_the_oracle_itself(dtype: str) -> None:
    report = validate(backends.get("numpy"), dtype=dtype, max_examples=15, seed=SEED)
    assert report.passed, report.summary()
    assert report.examples >= 15


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_accepts_an_independent_correct_implementation(dtype: str) -> None:
    report = validate(make(None), bounds=SMALL, dtype=dtype, max_examples=60, seed=SEED)
    assert report.passed, report.summary()
    assert "PASSED" in report.summary()


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("mutant", MUTANTS)
def test_rejects_planted_bug(mutant: str, dtype: str) -> None:
    report = validate(make(mutant), bounds=SMALL, dtype=dtype, max_examples=100, seed=SEED)
    assert not report.passed, f"{mutant} was not caught"
    failure = report.failures[0]
    text = report.summary()
    assert "FAILED" in text and "input: B=" in text
    # Hypothesis shrinks towards the smallest example that still fails.
    B, _, H, dk, dv = failure.case.shapes
    assert B == 1 and H == 1 and dk <= 2 and dv <= 2, failure.case.describe()


def test_rejects_transposed_state_when_it_is_square() -> None:
    """With dk == dv a transposed S has the right shape; only its values give it away."""
    transposed = make("returns_S_transposed")
    correct = make(None)

    def transposes_only_square_states(q, k, v, u, *, config, initial_state=None):
        square = q.shape[-1] == v.shape[-1]
        return (transposed if square else correct)(
            q, k, v, u, config=config, initial_state=initial_state
        )

    report = validate(transposes_only_square_states, bounds=SMALL, max_examples=100, seed=SEED)
    assert not report.passed
    failure = report.failures[0]
    assert failure.kind == "mismatch" and "S" in failure.message
    assert failure.case.shapes[3] == failure.case.shapes[4] == 2  # the smallest non-symmetric S


def test_a_crashing_implementation_is_a_failure_not_an_error() -> None:
    def crashes(q, k, v, u, *, config, initial_state=None):
        if q.shape[1] > 3:
            raise RuntimeError("kernel launch failed")
        return make(None)(q, k, v, u, config=config, initial_state=initial_state)

    report = validate(crashes, bounds=SMALL, max_examples=50, seed=SEED)
    assert not report.passed
    failure = report.failures[0]
    assert failure.kind == "crash" and "kernel launch failed" in failure.message
    assert failure.traceback and "RuntimeError" in failure.traceback
    assert failure.case.shapes[1] == 4  # shrunk to the shortest sequence that crashes


def test_wrong_return_types_and_shapes_are_failures() -> None:
    def returns_list(q, k, v, u, *, config, initial_state=None):
        return make(None)(q, k, v, u, config=config, initial_state=initial_state)[0].tolist()

    def drops_a_token(q, k, v, u, *, config, initial_state=None):
        o, state = make(None)(q, k, v, u, config=config, initial_state=initial_state)
        return o[:, 1:], state

    assert validate(returns_list, bounds=TOY, max_examples=5, seed=SEED).failures[0].kind == "type"
    assert (
        validate(drops_a_token, bounds=TOY, max_examples=5, seed=SEED).failures[0].kind == "shape"
    )


def test_output_only_implementations_are_checked_on_o() -> None:
    def output_only(q, k, v, u, *, config, initial_state=None):
        return make(None)(q, k, v, u, config=config, initial_state=initial_state)[0]

    assert validate(output_only, bounds=SMALL, max_examples=30, seed=SEED).passed
    late = make("nudge_one_step_late")

    def late_output_only(q, k, v, u, *, config, initial_state=None):
        return late(q, k, v, u, config=config, initial_state=initial_state)[0]

    assert not validate(late_output_only, bounds=SMALL, max_examples=100, seed=SEED).passed


@pytest.mark.parametrize("variant", ["delta", "linear"])
def test_variants_validate_and_catch_the_wrong_variant(variant: str) -> None:
    assert validate(backends.get("numpy"), variant=variant, max_examples=30, seed=SEED).passed
    wrong = backends.get("numpy", variant="vla")

    def vla_posing_as_variant(q, k, v, u, *, config, initial_state=None):
        return wrong(q, k, v, u, config=config, initial_state=initial_state)

    assert not validate(vla_posing_as_variant, variant=variant, max_examples=50, seed=SEED).passed


def test_rls_needs_the_exact_configuration() -> None:
    with pytest.raises(UnsupportedConfigurationError, match=r"VLAConfig\.exact"):
        validate(backends.get("numpy"), variant="rls", max_examples=5)
    assert validate(
        backends.get("numpy"),
        variant="rls",
        config=VLAConfig.exact(),
        bounds=SMALL,
        max_examples=10,
        seed=SEED,
    ).passed


def test_same_seed_same_report() -> None:
    a = validate(make("z_from_unit_keys"), bounds=TOY, max_examples=30, seed=5)
    b = validate(make("z_from_unit_keys"), bounds=TOY, max_examples=30, seed=5)
    assert a.failures[0].case.describe() == b.failures[0].case.describe()
    assert (
        validate(make(None), bounds=SMALL, max_examples=5).seed is not None
    )  # a drawn seed is reported


def test_usage_errors_raise() -> None:
    with pytest.raises(UnknownVariantError):
        validate(make(None), bounds=SMALL, variant="gla")
    with pytest.raises(DTypeError, match="dtype: array='numpy' supports"):
        validate(make(None), bounds=SMALL, dtype="bfloat16")
    with pytest.raises(ValueError, match="max_examples"):
        validate(make(None), bounds=SMALL, max_examples=0)


def test_carry_cut_respects_the_nudge_clock() -> None:
    """Without ``start`` the state (S, A, z) does not carry the nudge clock: cuts land on
    multiples of the period (or anywhere if no nudge falls after the cut).  With ``start`` any
    cut is valid (spec §2.3)."""
    assert carry_cut(7, 30, 20) == 20 and carry_cut(25, 61, 20) == 20
    assert carry_cut(3, 10, 20) == 3 and carry_cut(3, 10, None) == 3
    assert carry_cut(3, 20, 20) is None and carry_cut(1, 1, None) is None
    assert carry_cut(7, 30, 20, takes_start=True) == 7
    assert (
        carry_cut(3, 20, 20, takes_start=True) == 3
        and carry_cut(40, 30, 20, takes_start=True) == 29
    )


def test_an_unavailable_backend_raises_instead_of_failing() -> None:
    from vla_verify.backends.numpy_oracle import NumpyOracleBackend
    from vla_verify.errors import BackendUnavailableError

    class Offline(NumpyOracleBackend):
        def availability(self):
            return "no CUDA GPU on this machine"

    with pytest.raises(BackendUnavailableError, match="no CUDA GPU"):
        validate(Offline(), max_examples=5)


def test_chunk_size_is_checked_and_reported() -> None:
    from vla_verify.errors import VLAInputError

    oracle = backends.get("numpy")
    with pytest.raises(VLAInputError, match="chunk_size"):
        validate(oracle, max_examples=1, seed=0, chunk_size=0)
    report = validate(oracle, max_examples=2, seed=0, chunk_size=16)
    assert report.passed and report.chunk_size == 16 and "chunk_size=16" in report.summary()


def test_a_chunked_backend_declares_its_chunk_size() -> None:
    pytest.importorskip("torch")
    report = validate(
        backends.get("torch_chunked", chunk_size=32),
        config=VLAConfig(nudge_period=32),
        array="torch",
        dtype="float32",
        max_examples=2,
        seed=0,
    )
    assert report.chunk_size == 32


@pytest.mark.parametrize("mutant", MUTANTS)
def test_the_chunk_floor_still_rejects_planted_bugs(mutant: str) -> None:
    """The longer summation allowance (dk + C terms) leaves every wrong formula outside."""
    report = validate(make(mutant), bounds=SMALL, max_examples=60, seed=0, chunk_size=64)
    assert not report.passed, mutant


# -- arguments first, and what fn really did -----------------------------------------------------


def _correct(q, k, v, u, *, config, initial_state=None):
    return make(None)(q, k, v, u, config=config, initial_state=initial_state)


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"fn": None}, "fn"),
        ({"fn": "no_such_module_anywhere:fn"}, "fn"),
        ({"fn": "vla_verify:no_such_function"}, "fn"),
        ({"fn": "no_such_backend"}, "fn"),
        ({"config": {"lambda0": 0.1, "lambda_zero": 1.0}}, "config"),
        ({"config": "paper"}, "config"),
        ({"config": {"lambda0": -1.0}}, "lambda0"),
        ({"factor": -1}, "factor"),
        ({"factor": float("nan")}, "factor"),
        ({"max_examples": 2.5}, "max_examples"),
        ({"max_examples": True}, "max_examples"),
        ({"seed": 1.5}, "seed"),
        ({"dtype": "float128"}, "dtype"),
        ({"dtype": np.float32}, "dtype"),
        ({"array": "jax"}, "array"),
        ({"device": "cuda:0"}, "device"),
        ({"max_dk": 0}, "max_dk"),
        ({"max_T": "long"}, "max_T"),
        ({"max_batch": -2}, "max_batch"),
        ({"configs": "all"}, "configs"),
        ({"profile": "fast"}, "profile"),
        ({"chunk_size": 6.4}, "chunk_size"),
        ({"check_carry": "yes"}, "check_carry"),
    ],
)
def test_arguments_are_checked_before_any_example_runs(kwargs, argument) -> None:
    calls = []

    def counting(q, k, v, u, *, config, initial_state=None):
        calls.append(1)
        return _correct(q, k, v, u, config=config, initial_state=initial_state)

    fn = kwargs.pop("fn", counting)
    with pytest.raises(VLAInputError) as info:
        validate(fn, max_examples=kwargs.pop("max_examples", 3), **kwargs)
    assert info.value.argument == argument, str(info.value)
    assert not calls


def test_a_mapping_config_builds_a_vlaconfig() -> None:
    report = validate(
        _correct,
        bounds=SMALL,
        config={"lambda0": 1.0, "nudge_period": None},
        max_examples=3,
        seed=0,
    )
    assert report.passed, report.summary()


def test_a_string_names_the_implementation() -> None:
    assert validate("numpy", bounds=SMALL, max_examples=3, seed=0).passed
    assert validate("mutants:make", bounds=TOY, max_examples=1, seed=0).failures[0].kind == "crash"


def test_keyboard_interrupt_stops_the_run() -> None:
    def interrupted(q, k, v, u, *, config, initial_state=None):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        validate(interrupted, bounds=TOY, max_examples=5, seed=0)


def test_system_exit_inside_fn_is_a_failure_with_its_traceback(tmp_path) -> None:
    def exits(q, k, v, u, *, config, initial_state=None):
        raise SystemExit(3)

    report = validate(exits, bounds=TOY, max_examples=5, seed=0, failure_dir=tmp_path)
    failure = report.failures[0]
    assert failure.kind == "crash" and "SystemExit" in failure.message
    assert failure.traceback and "SystemExit" in failure.traceback


def test_in_place_modification_is_reported_with_the_inputs_as_drawn(tmp_path) -> None:
    def scales_u_in_place(q, k, v, u, *, config, initial_state=None):
        out = _correct(q, k, v, u, config=config, initial_state=initial_state)
        u *= 2.0
        return out

    report = validate(
        scales_u_in_place, bounds=SMALL, max_examples=10, seed=0, failure_dir=tmp_path
    )
    failure = report.failures[0]
    assert failure.kind == "in_place" and "u" in failure.message, failure.describe()
    # The case holds the arrays as drawn: the replay rebuilds the same input and fails again.
    again = validate_replay(failure.replay_path, scales_u_in_place)
    assert again.failures[0].kind == "in_place"
    assert np.array_equal(again.failures[0].case.u, failure.case.u)


def test_a_modified_initial_state_is_reported(tmp_path) -> None:
    def zeroes_the_given_state(q, k, v, u, *, config, initial_state=None):
        out = _correct(q, k, v, u, config=config, initial_state=initial_state)
        if initial_state is not None:
            initial_state[0][...] = 0.0
        return out

    failure = validate(
        zeroes_the_given_state, bounds=SMALL, max_examples=30, seed=0, failure_dir=tmp_path
    ).failures[0]
    assert failure.kind == "in_place" and "S0" in failure.message


def test_a_returned_dtype_other_than_the_request_is_a_failure(tmp_path) -> None:
    def returns_float64(q, k, v, u, *, config, initial_state=None):
        o, state = _correct(*(x.astype(np.float64) for x in (q, k, v, u)), config=config)
        return o, state

    report = validate(
        returns_float64, bounds=TOY, dtype="float32", max_examples=5, seed=0, failure_dir=tmp_path
    )
    failure = report.failures[0]
    assert failure.kind == "dtype" and "float64" in failure.message and "float32" in failure.message


def test_a_returned_device_other_than_the_request_is_a_failure(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    oracle = backends.get("torch")

    def returns_on_meta(q, k, v, u, *, config, initial_state=None):
        o, state = oracle(q, k, v, u, config=config, initial_state=initial_state)
        return o.to("meta"), state

    report = validate(
        returns_on_meta,
        bounds=TOY,
        array="torch",
        dtype="float32",
        max_examples=3,
        seed=0,
        failure_dir=tmp_path,
    )
    failure = report.failures[0]
    assert failure.kind == "device" and "meta" in failure.message
    assert torch  # imported for the backend


def test_the_carry_check_cuts_anywhere_with_start(tmp_path) -> None:
    """A kernel that takes start but ignores it restarts its nudge clock on the second half:
    only a cut off a multiple of the period, with start passed, shows it."""

    def ignores_start(q, k, v, u, *, config, initial_state=None, start=0):
        return _correct(q, k, v, u, config=config, initial_state=initial_state)

    report = validate(
        ignores_start,
        bounds=SMALL,
        config=VLAConfig(nudge_period=5),
        max_examples=100,
        seed=0,
        failure_dir=tmp_path,
    )
    failure = report.failures[0]
    assert failure.kind == "carry" and "start=" in failure.message, failure.describe()
    assert failure.cut % 5 != 0
    # Without start the same kernel is checked at multiples of the period only, and told so.
    quiet = validate(
        _correct, bounds=SMALL, config=VLAConfig(nudge_period=5), max_examples=30, seed=0
    )
    assert quiet.passed and any("start" in n for n in quiet.notes), quiet.summary()


def test_the_cli_replays_a_saved_failure(tmp_path, monkeypatch, capsys) -> None:
    from vla_verify.cli import main

    (tmp_path / "mykernel.py").write_text(
        "from vla_verify import backends\n"
        "_o = backends.get('numpy')\n"
        "def late(q, k, v, u, *, config, initial_state=None):\n"
        "    o, s = _o(q, k, v, u, config=config, initial_state=initial_state)\n"
        "    o[:, 3:] *= 1.001\n"
        "    return o, s\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    code = main(
        [
            "check",
            "mykernel:late",
            "--quiet",
            "--seed",
            "3",
            "--profile",
            "quick",
            "--failure-dir",
            str(tmp_path / "f"),
        ]
    )
    out = capsys.readouterr().out
    assert code == 1 and out.count("seed=") == 1
    line = next(ln for ln in out.splitlines() if "replay: vla-verify check" in ln)
    args = line.split("replay: vla-verify ", 1)[1].split()
    assert main(args) == 1
    again = capsys.readouterr().out
    assert "T=4" in again and "FAILED" in again


def validate_replay(path, fn):
    from vla_verify.validation import replay

    return replay(path, fn)


def test_an_example_beyond_the_references_reach_is_counted_not_judged(monkeypatch) -> None:
    """Where the oracle raises IllConditionedError, validate neither fails nor passes the
    example on that reference: it counts it.  A kernel wrong only there is not blamed."""
    from vla_verify import validation
    from vla_verify.errors import IllConditionedError

    real = validation.recurrence

    def vouches_for_short_sequences_only(q, *args, **kwargs):
        if q.shape[1] > 4:
            raise IllConditionedError("test stand-in", step=5, figure="delta", estimate=1.0)
        return real(q, *args, **kwargs)

    monkeypatch.setattr(validation, "recurrence", vouches_for_short_sequences_only)

    def wrong_past_four_tokens(q, k, v, u, *, config, initial_state=None):
        o, state = _correct(q, k, v, u, config=config, initial_state=initial_state)
        o[:, 4:] += 1.0
        return o, state

    report = validate(wrong_past_four_tokens, bounds=SMALL, max_examples=20, seed=0)
    assert report.passed and report.beyond_reach > 0, report.summary()
    assert "beyond the reference's reach" in report.summary()


def test_check_help_documents_every_option_with_its_default(capsys) -> None:
    from vla_verify.cli import build_parser

    parser = build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["check", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for option in (
        "--max-dk MAX_DK largest head width dk and dv drawn (default: 128; not with --head-dims)",
        "--head-dims W [W ...] draw dk and dv from these widths only",
        "--max-T MAX_T longest sequence drawn (default: 640)",
        "--max-batch MAX_BATCH largest B·H drawn (default: 6)",
        "(default: default)",
        "--sweep-config",
        "--replay FILE",
        "--factor FACTOR",
    ):
        assert option in text, option


@pytest.mark.parametrize(
    "argv",
    [
        ["check", "no_such_module_anywhere:fn"],
        ["check", "numpy", "--max-dk", "0"],
        ["check", "numpy", "--factor", "-1"],
        ["check", "numpy", "--max-examples", "0"],
        ["check", "numpy", "--replay", "/no/such/failure.npz"],
    ],
)
def test_check_usage_errors_exit_2_before_any_example(argv, capsys) -> None:
    from vla_verify.cli import main

    assert main([*argv, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "vla-verify: error:" in err and "examples" not in capsys.readouterr().out


# -- the reference validate judges against (spec §4; docs/reference.md) ----------------------


def _strongly_penalised_case(scale: float) -> tuple[np.ndarray, ...]:
    """Six tokens whose penalties have norm ``scale``: float64 loses the Sherman–Morrison
    chain's digits there (the raw oracle is percent-level off at 1e8)."""
    rng = np.random.default_rng(0)
    q = np.exp(rng.standard_normal((1, 6, 1, 3)))
    k = np.exp(rng.standard_normal((1, 6, 1, 3)))
    v = rng.standard_normal((1, 6, 1, 2))
    u = rng.standard_normal((1, 6, 1, 3)) * scale
    return q, k, v, u


def test_validate_never_judges_against_a_wrong_reference() -> None:
    """Where the float64 oracle cannot vouch for itself, ``validate``'s reference is the
    escalated mpmath result (checked against 500 digits), the request with the budget's scales
    included (tests/test_validate_escalated_reference.py judges kernels against it), or the
    example is beyond reach."""
    from vla_verify import oracle
    from vla_verify.validation import _BeyondReach, _reference, _reference_with_scales

    inputs = _strongly_penalised_case(1e8)
    config = VLAConfig.exact()
    o_mp, _ = oracle.recurrence_mp(*inputs, config=config, dps=500)
    raw = oracle.recurrence(*inputs, config=config)
    scale = np.max(np.abs(o_mp))
    assert np.max(np.abs(raw.o - o_mp)) / scale > 1e-2  # the raw float64 is wrong here
    got = _reference(inputs, None, config=config, variant="vla")
    assert np.max(np.abs(got.o - o_mp)) / scale <= 1e-10
    with_scales, _, measured = _reference_with_scales(inputs, None, config, "vla")
    assert measured is not None and np.max(np.abs(with_scales.o - o_mp)) / scale <= 1e-10
    too_large = [np.repeat(x, 3000, axis=0) for x in inputs]
    with pytest.raises(_BeyondReach):
        _reference_with_scales(too_large, None, config, "vla")


def test_ordinary_inputs_keep_the_float64_reference() -> None:
    """The escalation fires only where it is needed: an ordinary case keeps the float64 result
    (no measured float64 run comes back) over a history in several segments (meta-test of the
    threshold's other side)."""
    from vla_verify import oracle, validation

    rng = np.random.default_rng(1)
    q, k = (np.abs(rng.standard_normal((2, 30, 2, 4))) for _ in range(2))
    v = rng.standard_normal((2, 30, 2, 3))
    u = rng.standard_normal((2, 30, 2, 4)) / 2
    raw = oracle.recurrence(q, k, v, u, config=VLAConfig())
    for budget in (validation._HISTORY_BUDGET, 2 * 2 * 4 * 4 * 7):  # one segment, then five
        old, validation._HISTORY_BUDGET = validation._HISTORY_BUDGET, budget
        try:
            got, scales, measured = validation._reference_with_scales(
                [q, k, v, u], None, VLAConfig(), "vla"
            )
        finally:
            validation._HISTORY_BUDGET = old
        assert measured is None and got.diagnostics is not None
        np.testing.assert_array_equal(got.o, raw.o)
        assert np.all(scales["A"] >= 1 / VLAConfig().lambda0)


def test_a_zero_error_against_a_zero_budget_is_a_ratio_of_zero() -> None:
    """Known answers of the ratio where the budget is zero (the same-precision oracle exact, its
    scale zero): an exact output is at 0 of it and passes, any error is at infinity and
    fails; an output that is not finite is at infinity whatever the budget."""
    from vla_verify.error_model import compare

    ref = np.zeros((1, 2, 1, 3))
    exact = compare("o", ref.copy(), ref, ref.copy(), "float16")
    assert exact.ratio == 0.0 and exact.passed
    off = ref.copy()
    off[0, 1, 0, 2] = 1e-30
    wrong = compare("o", off, ref, ref.copy(), "float16")
    assert wrong.ratio == np.inf and not wrong.passed
    off[0, 1, 0, 2] = np.nan
    assert compare("o", off, ref, ref.copy(), "float16").ratio == np.inf


def test_a_query_that_underflows_in_float16_is_judged_with_a_finite_ratio() -> None:
    """One token whose query (2e-8) is zero in float16: the outputs and the float16 oracle's
    are exactly zero, so the budget of ``o`` is zero; the example is judged at a finite ratio
    (a NaN ratio there stopped ``validate`` inside Hypothesis' ``target``), and an output off
    there by float16's smallest subnormal fails."""
    from vla_verify.properties.strategies import Case
    from vla_verify.validation import _evaluate

    one = np.ones((1, 1, 1, 1))
    case = Case(q=2.07857918e-08 * one, k=-0.56282334 * one, v=0.0421181 * one, u=one,
                initial_state=None, split=1, regimes={}, seed=33)  # fmt: skip
    config = VLAConfig(normalize_output=False)
    oracle = backends.get("numpy")

    def run(fn):
        return _evaluate(fn, case, config=config, variant="vla", array="numpy", dtype="float16",
                         device="cpu", factor=2.0, check_carry=True, chunk_size=None,
                         takes_start=True)  # fmt: skip

    exact = run(oracle)
    assert exact.status == "judged" and exact.failure is None
    assert np.isfinite(exact.ratio) and exact.ratio <= 1  # that of S; o's is 0

    def off_by_the_smallest_subnormal(q, k, v, u, *, config, initial_state=None, start=0):
        o, state = oracle(q, k, v, u, config=config, initial_state=initial_state, start=start)
        return o + np.float16(2.0**-24), state

    assert run(off_by_the_smallest_subnormal).failure is not None


def test_the_overflow_thresholds_are_where_the_dtypes_round_to_infinity() -> None:
    """Just below each threshold a number rounds to a finite value, at it to infinity (NumPy
    rounds float64 to float16 and float32 once; bf16 from the float32 neighbours, as the
    thresholds of bf16 are float32 numbers)."""
    import torch

    from vla_verify.validation import OVERFLOW_THRESHOLD

    with np.errstate(over="ignore"):
        for name, dtype in (("float16", np.float16), ("float32", np.float32)):
            limit = OVERFLOW_THRESHOLD[name]
            assert np.isfinite(dtype(np.nextafter(limit, 0.0))), name
            assert np.isinf(dtype(limit)), name
    limit = np.float32(OVERFLOW_THRESHOLD["bfloat16"])
    pair = torch.tensor([np.nextafter(limit, np.float32(0)), limit]).to(torch.bfloat16)
    assert torch.isfinite(pair[0]) and torch.isinf(pair[1])


def test_an_exact_result_beyond_the_dtypes_range_is_outside_the_envelope(monkeypatch) -> None:
    """Known answer: one token whose exact output is 8e4 (``v / out_eps``), beyond float16's
    largest finite value: correctly rounded it is infinite, so the example is outside float16's
    envelope even where the same-precision oracle stays finite (a stand-in run in float32
    here; on a case the search found, rounding every operation in float16 kept it at 58400
    where the exact value was 65592); in float32 the same example is judged and passes."""
    from vla_verify import validation
    from vla_verify.backends.numpy_oracle import recurrence
    from vla_verify.properties.strategies import Case

    one = np.ones((1, 1, 1, 1))
    case = Case(q=one, k=1e-5 * one, v=8 * one, u=one, initial_state=None, split=1, regimes={},
                seed=0)  # fmt: skip
    real = validation.same_precision_runs

    def finite_stand_in(*args, **kwargs):
        return real(*args, **{**kwargs, "dtype": "float32"})

    monkeypatch.setattr(validation, "same_precision_runs", finite_stand_in)

    def exact_then_rounded(q, k, v, u, *, config, initial_state=None):
        r = recurrence(*(x.astype(np.float64) for x in (q, k, v, u)), config=config)
        with np.errstate(over="ignore"):
            return r.o.astype(q.dtype), tuple(x.astype(q.dtype) for x in r.state)

    def run(dtype: str):
        return validation._evaluate(
            exact_then_rounded, case, config=VLAConfig(), variant="vla", array="numpy",
            dtype=dtype, device="cpu", factor=2.0, check_carry=False, chunk_size=None,
            takes_start=False,
        )  # fmt: skip

    drawn = (case.q, case.k, case.v, case.u)
    o16, _ = exact_then_rounded(*(x.astype(np.float16) for x in drawn), config=VLAConfig())
    assert np.isinf(o16).all()
    assert run("float16").status == "outside"
    judged = run("float32")
    assert judged.status == "judged" and judged.failure is None
