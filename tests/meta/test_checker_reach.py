"""The conformance checker's reach (spec §4): with its defaults, ``validate`` rejects bugs that
live only in a kernel's structure — past a chunk of 64 or 128 tokens, past a tile of 16 or 32 key
lanes, past two batch elements or heads, with ``dk != dv``, and (under the configuration sweep) a
field of ``VLAConfig`` read as the preset's — and shrinks each to a small counterexample, while
every correct implementation is still accepted.

One ``validate`` run per mutant, with a fixed seed (the same examples on every run).  The
shrunk sizes asserted here are those docs/checker.md reports.
"""

from __future__ import annotations

import os

import pytest
from reach_mutants import CONFIG_MUTANTS, make

from vla_verify import VLAConfig, backends, validate
from vla_verify.errors import VLAInputError
from vla_verify.properties.strategies import ShapeBounds
from vla_verify.validation import replay

SEED = 20261201
#: The search effort of the runs that must pass: the ``ci`` Hypothesis profile's count in CI.
PASSING_PROFILE = "quick" if os.environ.get("HYPOTHESIS_PROFILE", "ci") == "ci" else "default"

#: Per mutant: what the shrunk counterexample must look like (shapes ``(B, T, H, dk, dv)``).
SHRUNK = {
    # Needs T > 64: shrinks to T <= 2·64 + 1.
    "loses_A_after_64": lambda B, T, H, dk, dv: 64 < T <= 129,
    # Needs T > 128: shrinks to T <= 2·128 + 1.
    "drops_S_after_128": lambda B, T, H, dk, dv: 128 < T <= 257,
    # Needs dk > 16: shrinks to dk <= 32.
    "gate_norm_first_16": lambda B, T, H, dk, dv: 16 < dk <= 32,
    # Needs dk > 32: shrinks to dk <= 64 (the next tiling width).
    "gate_norm_first_32": lambda B, T, H, dk, dv: 32 < dk <= 64,
    "clamps_batch": lambda B, T, H, dk, dv: B == 3 and H == 1,
    "clamps_heads": lambda B, T, H, dk, dv: H == 3 and B == 1,
    "masks_with_other_width": lambda B, T, H, dk, dv: dk != dv and max(dk, dv) <= 2,
    "ignores_nudge_eta": lambda B, T, H, dk, dv: B == H == 1 and T <= 20,
    "ignores_sm_floor": lambda B, T, H, dk, dv: B == H == 1 and T <= 2,
}


@pytest.mark.parametrize("mutant", list(SHRUNK))
def test_validate_with_its_defaults_rejects_a_structural_bug(mutant: str, tmp_path) -> None:
    configs = "sweep" if mutant in CONFIG_MUTANTS else "given"
    fn = make(mutant)
    report = validate(fn, seed=SEED, configs=configs, failure_dir=tmp_path)
    assert not report.passed, f"{mutant} was not caught: {report.summary()}"
    failure = report.failures[0]
    assert failure.kind in ("mismatch", "carry"), failure.describe()
    shapes = failure.case.shapes
    assert SHRUNK[mutant](*shapes), f"{mutant} shrank to {shapes}"
    # The report can be acted on: shapes, configuration, budget terms, a replay that fails again.
    text = report.summary()
    assert text.count("seed=") == 1 and "config: VLAConfig(" in text and "× err_p" in text
    assert failure.replay_path and failure.replay_line and "replay(" in failure.replay_line
    again = replay(failure.replay_path, fn)
    assert not again.passed and again.failures[0].case.shapes == shapes


def test_the_sweep_is_what_catches_an_ignored_field(tmp_path) -> None:
    """Without the sweep, a kernel reading nudge_eta as the preset's agrees with the preset."""
    report = validate(
        make("ignores_nudge_eta"), seed=SEED, profile=PASSING_PROFILE, failure_dir=tmp_path
    )
    assert report.passed, report.summary()


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_accepts_the_oracle(dtype: str, tmp_path) -> None:
    report = validate(
        backends.get("numpy"), dtype=dtype, seed=SEED, profile=PASSING_PROFILE, failure_dir=tmp_path
    )
    assert report.passed, report.summary()


def test_accepts_an_independent_correct_implementation(tmp_path) -> None:
    report = validate(make(None), seed=SEED, profile=PASSING_PROFILE, failure_dir=tmp_path)
    assert report.passed, report.summary()
    assert not any("start" in n for n in report.notes)  # it takes start: cuts anywhere


def test_accepts_torch(tmp_path) -> None:
    pytest.importorskip("torch")
    report = validate(
        backends.get("torch"),
        dtype="float32",
        seed=SEED,
        profile=PASSING_PROFILE,
        failure_dir=tmp_path,
    )
    assert report.passed, report.summary()


def test_accepts_torch_chunked_at_chunk_64(tmp_path) -> None:
    pytest.importorskip("torch")
    report = validate(
        backends.get("torch_chunked", chunk_size=64),
        config=VLAConfig(nudge_period=64),
        dtype="float32",
        seed=SEED,
        profile=PASSING_PROFILE,
        failure_dir=tmp_path,
    )
    assert report.passed, report.summary()
    assert report.chunk_size == 64


def _triton_fused():
    pytest.importorskip("triton")
    backend = backends.get("triton_fused")
    reason = backend.availability()
    if reason is not None:
        pytest.skip(reason)
    return backend


@pytest.mark.triton
def test_accepts_triton_fused_through_the_interpreter_on_a_handful(tmp_path) -> None:
    """The interpreter runs a few small examples in CI; the larger run is marked slow."""
    report = validate(
        _triton_fused(),
        config=VLAConfig(nudge_period=64),
        dtype="float32",
        seed=SEED,
        max_examples=4,
        max_dk=16,
        max_T=70,
        max_batch=2,
        failure_dir=tmp_path,
    )
    assert report.passed, report.summary()


@pytest.mark.slow
@pytest.mark.triton
def test_accepts_triton_fused_through_the_interpreter_at_width_64(tmp_path) -> None:
    report = validate(
        _triton_fused(),
        config=VLAConfig(nudge_period=64),
        dtype="float32",
        seed=SEED,
        max_examples=25,
        max_dk=64,
        max_T=200,
        max_batch=4,
        failure_dir=tmp_path,
    )
    assert report.passed, report.summary()


def _only_at(widths: tuple[int, ...], fn):
    """``fn`` as a kernel that supports the head widths ``widths`` alone (it raises otherwise),
    recording every ``(dk, dv)`` it is called with."""
    seen: list[tuple[int, int]] = []

    def kernel(q, k, v, u, *, config, initial_state=None, start=0):
        dk, dv = q.shape[-1], v.shape[-1]
        seen.append((dk, dv))
        if dk not in widths or dv not in widths:
            raise ValueError(f"head widths {dk}, {dv} unsupported")
        return fn(q, k, v, u, config=config, initial_state=initial_state, start=start)

    kernel.__qualname__ = getattr(fn, "__qualname__", "kernel")
    return kernel, seen


def test_head_dims_run_every_example_at_the_given_widths(tmp_path) -> None:
    """A kernel of head widths 64 and 128 only passes with ``head_dims``; the default mix calls
    it at a width it does not support and reports the crash."""
    kernel, seen = _only_at((64, 128), make(None))
    report = validate(kernel, head_dims=(64, 128), seed=SEED, max_examples=4, max_T=70,
                      failure_dir=tmp_path)  # fmt: skip
    assert report.passed, report.summary()
    assert seen and {w for pair in seen for w in pair} <= {64, 128}
    assert "head_dims=64,128" in report.summary()
    report = validate(kernel, seed=SEED, max_examples=4, max_T=70, failure_dir=tmp_path)
    assert not report.passed and report.failures[0].kind == "crash"


def test_head_dims_reach_a_bug_of_wide_heads_in_few_examples(tmp_path) -> None:
    """A tiled reduction over the first 32 key lanes is wrong only past 32: at ``head_dims``
    ``(64,)`` the first examples are at 64, and the counterexample shrinks to one token there."""
    report = validate(make("gate_norm_first_32"), head_dims=(64,), seed=SEED, max_examples=3,
                      max_T=70, failure_dir=tmp_path)  # fmt: skip
    assert not report.passed, report.summary()
    assert report.failures[0].case.shapes == (1, 1, 1, 64, 64)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"head_dims": ()}, "non-empty sequence"),
        ({"head_dims": 64}, "non-empty sequence"),
        ({"head_dims": "64"}, "non-empty sequence"),
        ({"head_dims": (64, 0)}, "positive integer widths"),
        ({"head_dims": (64, True)}, "positive integer widths"),
        ({"head_dims": (64,), "max_dk": 64}, "not both"),
        ({"head_dims": (64,), "bounds": ShapeBounds()}, "not both"),
    ],
)
def test_head_dims_are_checked(kwargs, message) -> None:
    with pytest.raises(VLAInputError, match=message) as info:
        validate(make(None), max_examples=1, **kwargs)
    assert info.value.argument == "head_dims"
