"""``validate`` (spec §4): it accepts correct implementations and rejects planted bugs.

The meta-tests below are the checker's own tests: each mutant in ``tests/mutants.py`` plants one
bug of a kind real kernels have had, and ``validate`` must reject it with a shrunk
counterexample.  The correct implementation there is written independently of the oracle.
"""

from __future__ import annotations

import pytest
from mutants import MUTANTS, make

from vla_verify import VLAConfig, backends, validate
from vla_verify.errors import DTypeError, UnknownVariantError, UnsupportedConfigurationError
from vla_verify.validation import _carry_cut

SEED = 20261130


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_accepts_the_oracle_itself(dtype: str) -> None:
    report = validate(backends.get("numpy"), dtype=dtype, max_examples=60, seed=SEED)
    assert report.passed, report.summary()
    assert report.examples >= 60


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_accepts_an_independent_correct_implementation(dtype: str) -> None:
    report = validate(make(None), dtype=dtype, max_examples=60, seed=SEED)
    assert report.passed, report.summary()
    assert "PASSED" in report.summary()


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("mutant", MUTANTS)
def test_rejects_planted_bug(mutant: str, dtype: str) -> None:
    report = validate(make(mutant), dtype=dtype, max_examples=100, seed=SEED)
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

    report = validate(transposes_only_square_states, max_examples=100, seed=SEED)
    assert not report.passed
    failure = report.failures[0]
    assert failure.kind == "mismatch" and "S" in failure.message
    assert failure.case.shapes[3] == failure.case.shapes[4] == 2  # the smallest non-symmetric S


def test_a_crashing_implementation_is_a_failure_not_an_error() -> None:
    def crashes(q, k, v, u, *, config, initial_state=None):
        if q.shape[1] > 3:
            raise RuntimeError("kernel launch failed")
        return make(None)(q, k, v, u, config=config, initial_state=initial_state)

    report = validate(crashes, max_examples=50, seed=SEED)
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

    assert validate(returns_list, max_examples=5, seed=SEED).failures[0].kind == "type"
    assert validate(drops_a_token, max_examples=5, seed=SEED).failures[0].kind == "shape"


def test_output_only_implementations_are_checked_on_o() -> None:
    def output_only(q, k, v, u, *, config, initial_state=None):
        return make(None)(q, k, v, u, config=config, initial_state=initial_state)[0]

    assert validate(output_only, max_examples=30, seed=SEED).passed
    late = make("nudge_one_step_late")

    def late_output_only(q, k, v, u, *, config, initial_state=None):
        return late(q, k, v, u, config=config, initial_state=initial_state)[0]

    assert not validate(late_output_only, max_examples=100, seed=SEED).passed


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
        backends.get("numpy"), variant="rls", config=VLAConfig.exact(), max_examples=20, seed=SEED
    ).passed


def test_same_seed_same_report() -> None:
    a = validate(make("z_from_unit_keys"), max_examples=30, seed=5)
    b = validate(make("z_from_unit_keys"), max_examples=30, seed=5)
    assert a.failures[0].case.describe() == b.failures[0].case.describe()
    assert validate(make(None), max_examples=5).seed is not None  # a drawn seed is reported


def test_usage_errors_raise() -> None:
    with pytest.raises(UnknownVariantError):
        validate(make(None), variant="gla")
    with pytest.raises(DTypeError, match="dtype: array='numpy' supports"):
        validate(make(None), dtype="bfloat16")
    with pytest.raises(ValueError, match="max_examples"):
        validate(make(None), max_examples=0)


def test_carry_cut_respects_the_nudge_clock() -> None:
    """The state (S, A, z) does not carry the nudge clock: cuts land on multiples of the period
    (or anywhere if no nudge falls in the sequence)."""
    assert _carry_cut(7, 30, 20) == 20 and _carry_cut(25, 61, 20) == 20
    assert _carry_cut(3, 10, 20) == 3 and _carry_cut(3, 10, None) == 3
    assert _carry_cut(3, 20, 20) is None and _carry_cut(1, 1, None) is None


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
    report = validate(make(mutant), max_examples=60, seed=0, chunk_size=64)
    assert not report.passed, mutant
