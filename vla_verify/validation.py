"""``validate(fn)``: drive Hypothesis-generated inputs through an implementation and the oracle.

``fn`` follows spec §4: ``fn(q, k, v, u, *, config, initial_state=None[, start=0])`` returning
``o`` or ``(o, (S, A, z))`` (any entry of the state may be ``None`` when the implementation does
not keep it).  Each example:

1. draws inputs from :func:`vla_verify.properties.strategies.conformance_cases` — sizes that
   reach a kernel's structure (tiling and ragged head widths up to 128, lengths across several
   chunks of 64 and 128, ``B·H`` up to 6) and the hard corners of the values (nearly parallel
   keys, ill-conditioned penalties, tiny read-out denominators, given initial states) — and,
   with ``configs="sweep"``, a configuration (:func:`~vla_verify.properties.strategies.
   swept_configs`);
2. converts them to the requested array library, dtype and device, and reads back the exact values
   ``fn`` sees, so the reference is computed from the same rounded inputs; ``fn`` gets fresh
   copies on every call, and a change to them is reported as in-place modification;
3. runs the reference (:func:`_reference_with_scales` and :func:`_reference`, the only places
   where the oracle is called: the float64 oracle where its own accuracy estimate vouches for
   it, else the escalated mpmath reference, else the example is beyond the reference's reach)
   and the oracle in ``fn``'s precision (the baseline of :mod:`vla_verify.error_model`, several
   runs that round differently: :func:`same_precision_runs`);
4. checks what ``fn`` returned (array type, dtype, device, shape), then compares ``o`` and every
   returned state entry slice by slice against the budget; and, when ``fn`` returns a state,
   checks *state carry*: the sequence cut in two, the second half started from the state ``fn``
   returned for the first (and ``start=cut`` when ``fn`` takes ``start``, spec §2.3), must give
   the whole sequence's output.

A wrong or crashing ``fn`` never raises: it is a failure in the report, with Hypothesis's shrunk
counterexample, saved to a file that :func:`replay` reruns.  Misuse of ``validate`` itself (a
wrong argument) raises a :class:`~vla_verify.errors.VLAInputError` naming the argument before any
example runs; a ``KeyboardInterrupt`` inside ``fn`` stops the run.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import math
import numbers
import os
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import HealthCheck, Phase, given, reject, settings, target
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.errors import Flaky

from .arrays import ARRAY_LIBRARIES, array_dtypes, from_numpy, is_torch, to_numpy
from .backends.numpy_oracle import OracleResult, recurrence
from .backends.registry import Backend
from .error_model import DEFAULT_FACTOR, SliceComparison, compare
from .errors import (
    BackendUnavailableError,
    ConfigError,
    DeviceError,
    DTypeError,
    IllConditionedError,
    UnsupportedConfigurationError,
    VLAInputError,
)
from .oracle import DEFAULT_TARGET_RTOL, ESTIMATE_SAFETY
from .oracle import reference as oracle_reference
from .oracle import reference_history as oracle_reference_history
from .properties.strategies import (
    Case,
    ConformanceSizes,
    ShapeBounds,
    cases,
    conformance_cases,
    swept_configs,
)
from .spec import Shapes, VLAConfig, check_variant, unit_roundoff

#: The float64 reference is used only where ``REFERENCE_SAFETY`` times its own error estimate is
#: at most ``REFERENCE_RTOL`` (the factor by which the estimate may fall short of the true error,
#: measured by tests/meta/test_oracle_accuracy_estimate.py); elsewhere it escalates to mpmath.
REFERENCE_RTOL = DEFAULT_TARGET_RTOL
REFERENCE_SAFETY = ESTIMATE_SAFETY
#: Where ``REFERENCE_SAFETY`` times the float64 estimate passes ``REFERENCE_RTOL`` the values
#: judged come from the escalated reference, while the floor's scales still come from the
#: float64 history: up to ``SCALE_TRUST`` (every magnitude within a factor of two), past which
#: they come from the escalated reference's history (see :func:`_reference_with_scales`).
SCALE_TRUST = 0.5

__all__ = [
    "PROFILES",
    "Failure",
    "ValidationReport",
    "carry_cut",
    "evaluate_case",
    "replay",
    "same_precision_runs",
    "validate",
]

#: Runs of the same-precision oracle per example (see :func:`same_precision_runs`): on short
#: sequences one run can round almost exactly, so eight; from ``LONG_SEQUENCE`` tokens on, each
#: slice's error is already the largest over many roundings (``T·dv`` elements, each the end of
#: ``T`` steps), and three runs give the same budget at a third of the cost.
BASELINE_SAMPLES = 8
LONG_SEQUENCE_SAMPLES = 3
LONG_SEQUENCE = 32


def baseline_samples(T: int) -> int:
    """How many same-precision oracle runs the budget of a ``T``-token example takes."""
    return BASELINE_SAMPLES if T < LONG_SEQUENCE else LONG_SEQUENCE_SAMPLES


#: Search effort per profile: examples to try.  ``quick`` is the ``ci`` Hypothesis profile's
#: count (tests/conftest.py), ``thorough`` the ``thorough`` profile's.
PROFILES: dict[str, int] = {"quick": 25, "default": 100, "thorough": 1000}

#: Where failing cases are saved for :func:`replay` unless ``failure_dir`` says otherwise.
#: (The default lies outside any working tree, so a failing test leaves nothing to commit.)
FAILURE_DIR_ENV = "VLA_VERIFY_FAILURE_DIR"
DEFAULT_FAILURE_DIR = os.path.join(tempfile.gettempdir(), "vla-verify-failures")

#: The oracle's state history is computed in segments of at most this many float64 numbers per
#: array, so that wide, long examples do not hold ``T`` states of ``dk × dk`` at once.
_HISTORY_BUDGET = 4_000_000

Implementation = Callable[..., Any]


@dataclass
class Failure:
    """One failing example: what went wrong, on which (shrunk) input, by how much."""

    # "mismatch" | "carry" | "crash" | "shape" | "nonfinite" | "type" | "dtype" | "device"
    # | "in_place"
    kind: str
    message: str
    case: Case
    comparisons: list[SliceComparison] = field(default_factory=list)
    traceback: str | None = None
    config: VLAConfig | None = None
    cut: int | None = None  # the state-carry cut, when the carry check ran
    replay_path: str | None = None
    replay_line: str | None = None

    def describe(self) -> str:
        B, T, H, dk, dv = self.case.shapes
        regimes = ", ".join(f"{k}={v}" for k, v in self.case.regimes.items())
        # The shapes and regimes only: the report's one seed is Hypothesis's, in its head line.
        lines = [
            f"[{self.kind}] {self.message}",
            f"  input: B={B} T={T} H={H} dk={dk} dv={dv}; {regimes}",
        ]
        if self.config is not None:
            lines.append(f"  config: {self.config!r}")
        if self.cut is not None:
            lines.append(f"  state-carry cut after token {self.cut}")
        for c in self.comparisons:
            if c.passed:
                continue
            excess = np.where(np.isfinite(c.error), c.error - c.budget, np.inf)
            b, h = np.unravel_index(int(np.argmax(excess)), c.error.shape)
            lines.append(
                f"  {c.name}: worst slice (b={b}, h={h}): max error {c.error[b, h]:.3e} > "
                f"budget {c.budget[b, h]:.3e}; worst element {c.name}{list(c.worst_index)}: "
                f"got {c.got_at_worst:.17g}, expected {c.ref_at_worst:.17g}"
            )
            if c.baseline is not None and c.floor is not None:
                lines.append(
                    f"    budget = {c.multiplier:g} × err_p {c.baseline[b, h]:.3e} "
                    f"+ floor {c.floor[b, h]:.3e} (err_p: the oracle in fn's precision)"
                )
        if self.traceback:
            lines.append("  traceback (last lines):")
            lines.extend("    " + ln for ln in self.traceback.strip().splitlines()[-8:])
        with np.printoptions(precision=6, threshold=48, edgeitems=3, linewidth=110):
            for name, x in self.case.arrays().items():
                # Size-1 axes squeezed away so that a shrunk example reads as a small matrix.
                text = np.array2string(np.squeeze(np.asarray(x)), prefix="    ")
                lines.append(f"  {name} {tuple(np.shape(x))} (squeezed, as drawn) =\n    {text}")
        if self.replay_line:
            lines.append(f"  replay: {self.replay_line}")
        return "\n".join(lines)


@dataclass
class ValidationReport:
    """Result of :func:`validate`: ``.passed``, ``.failures`` and a printable ``.summary()``."""

    passed: bool
    failures: list[Failure]
    examples: int
    rejected: int
    worst_ratio: float  # largest error/budget seen on passing examples
    variant: str
    array: str
    dtype: str
    device: str
    seed: int | None
    elapsed_s: float
    name: str = "fn"
    chunk_size: int | None = None  # the declared chunk length of a chunked implementation
    beyond_reach: int = 0  # examples the reference could not vouch for (IllConditionedError)
    configs: str = "given"  # "given" or "sweep"
    notes: list[str] = field(default_factory=list)
    replayed: bool = False  # one saved case rerun by :func:`replay`, not a search
    head_dims: tuple[int, ...] | None = None  # the only widths drawn, where validate was given them

    def summary(self) -> str:
        head = (
            f"{self.name}: {'PASSED' if self.passed else 'FAILED'} — variant={self.variant} "
            f"array={self.array} dtype={self.dtype} device={self.device}"
            + ("" if self.chunk_size is None else f" chunk_size={self.chunk_size}")
            + ("" if self.configs == "given" else f" configs={self.configs}")
            + ("" if self.head_dims is None else f" head_dims={','.join(map(str, self.head_dims))}")
            + f"; {self.examples} examples ({self.rejected} outside the precision's envelope"
            + (f", {self.beyond_reach} beyond the reference's reach" if self.beyond_reach else "")
            + f"), seed={self.seed}, {self.elapsed_s:.1f} s; worst error/budget on passing "
            f"examples {self.worst_ratio:.3g}"
        )
        parts = [head, *(f"note: {n}" for n in self.notes)]
        if self.passed:
            return "\n".join(parts)
        how = "replayed from its file" if self.replayed else "shrunk by Hypothesis"
        parts.append(f"{len(self.failures)} failure(s), {how}:")
        parts.extend(f.describe() for f in self.failures)
        return "\n".join(parts)

    def __bool__(self) -> bool:
        return self.passed


class _CheckFailed(AssertionError):
    def __init__(self, failure: Failure) -> None:
        self.failure = failure
        super().__init__(failure.message)


class _BeyondReach(Exception):
    """The reference raised :class:`IllConditionedError`: the example cannot be judged."""


def _finite(arrays: Any) -> bool:
    return all(np.all(np.isfinite(a)) for a in arrays)


#: The magnitude from which a real number rounds to infinity in each dtype: the largest finite
#: value plus half its spacing (``(2 − 2^−p)·2^emax`` for ``p`` significant bits).
OVERFLOW_THRESHOLD = {
    "float16": (2.0 - 2.0**-11) * 2.0**15,
    "bfloat16": (2.0 - 2.0**-8) * 2.0**127,
    "float32": (2.0 - 2.0**-24) * 2.0**127,
    "float64": math.inf,
}


def _representable(arrays: Any, dtype: str) -> bool:
    """Whether every entry of the float64 ``arrays`` rounds to a finite number in ``dtype``."""
    limit = OVERFLOW_THRESHOLD.get(dtype, math.inf)
    return all(np.all(np.abs(a) < limit) for a in arrays)


# -- the reference: every oracle call of the checker goes through here ------------------------


def _reference(
    inputs: Sequence[np.ndarray],
    initial_state: Any,
    *,
    config: VLAConfig,
    variant: str,
    dtype: str | None = None,
    start: int = 0,
) -> OracleResult:
    """The oracle (spec §2.3) on float64 arrays, in ``dtype`` (default float64).

    The float64 run tracks its own accuracy (:mod:`vla_verify.backends.oracle_accuracy`);
    where ``REFERENCE_SAFETY`` times its estimate passes ``REFERENCE_RTOL`` the result comes
    from :func:`vla_verify.oracle.reference` (mpmath at the digits the estimate asks for).
    Where the reference cannot vouch for its own result it raises :class:`IllConditionedError`;
    the example is then beyond the reference's reach and is counted as such, never judged
    against a reference that may be wrong (:class:`_BeyondReach`).  The float64 result carries
    its ``diagnostics``; an escalated one carries none.
    """
    kwargs: dict[str, Any] = dict(
        config=config, variant=variant, initial_state=initial_state, start=start
    )
    try:
        if dtype not in (None, "float64"):
            # A same-precision run: its rounding is the point, not an error of the reference.
            return recurrence(*inputs, dtype=dtype, **kwargs)
        result = recurrence(*inputs, diagnose=True, **kwargs)
    except IllConditionedError as exc:
        raise _BeyondReach(str(exc)) from exc
    diag = result.diagnostics
    if diag is None or REFERENCE_SAFETY * diag.estimate <= REFERENCE_RTOL:
        return result
    return _escalated(inputs, kwargs)


def _escalated(inputs: Sequence[np.ndarray], kwargs: dict[str, Any]) -> OracleResult:
    """:func:`vla_verify.oracle.reference` (mpmath at the digits the float64 estimate asks
    for), or :class:`_BeyondReach` where it cannot vouch for its result."""
    try:
        escalated = oracle_reference(*inputs, target_rtol=REFERENCE_RTOL, **kwargs)
    except IllConditionedError as exc:
        raise _BeyondReach(str(exc)) from exc
    return OracleResult(escalated.o, escalated.state, None)


def same_precision_runs(
    inputs: Sequence[np.ndarray],
    initial_state: tuple[np.ndarray, ...] | None,
    *,
    config: VLAConfig,
    variant: str,
    dtype: str,
    seed: int = 0,
    samples: int = BASELINE_SAMPLES,
    start: int = 0,
) -> list[OracleResult]:
    """The oracle in ``fn``'s precision (float32 for a float64 ``fn``), ``samples`` times.

    The first run takes the inputs as they are; the others take copies perturbed by one unit in
    the last place of that precision, element by element with random signs.  Each run rounds
    differently, and the budget uses the largest of their errors: one run can be lucky (a short
    sequence may round almost exactly), and a budget built on a lucky run would fail a correct
    implementation that rounds differently.
    """
    base_dtype = "float32" if dtype == "float64" else dtype
    ulp = 2.0 * unit_roundoff(base_dtype)
    rng = np.random.default_rng(seed)
    runs = []
    for sample in range(samples):
        if sample == 0:
            xs, state = list(inputs), initial_state
        else:

            def jiggle(x: np.ndarray) -> np.ndarray:
                return x * (1.0 + ulp * rng.choice((-1.0, 1.0), size=x.shape))

            xs = [jiggle(x) for x in inputs]
            state = None if initial_state is None else tuple(jiggle(x) for x in initial_state)
        runs.append(
            _reference(xs, state, config=config, variant=variant, dtype=base_dtype, start=start)
        )
    return runs


def _reference_with_scales(
    inputs: Sequence[np.ndarray],
    initial: tuple[np.ndarray, ...] | None,
    config: VLAConfig,
    variant: str,
    start: int = 0,
) -> tuple[OracleResult, dict[str, np.ndarray], OracleResult | None]:
    """The reference, per (b, h) the magnitude of the terms that make each quantity (the
    floor's scale of :mod:`vla_verify.error_model`), and the float64 result where the reference
    is escalated (else ``None``: the reference is that result), whose error against the
    reference is then measured (``measured`` of :func:`~vla_verify.error_model.compare`).

    ``S, A, z``: the largest entry over the run, the initial state included.  ``o``: the
    a-priori scale of the read-out ``o_t = S_t q_t / d_t`` — the dot product's terms,
    ``max_t (|S_t| |q_t|) / d_t`` — since its rounding error is bounded by ``|S_t| |q_t|``, not
    by ``|o_t|`` (large values and small read-outs cancel).  The history is taken from the
    float64 recurrence in segments continued with ``start`` (spec §2.3), which repeats the whole
    run's arithmetic exactly.

    The values judged (``o`` and the final state) are the float64 result where its own estimate
    vouches for it (``REFERENCE_SAFETY · estimate <= REFERENCE_RTOL``, estimated over the whole
    run), else the escalated reference (:func:`vla_verify.oracle.reference`).  The scales stay
    those of the float64 history, which is sound because a scale only needs its order of
    magnitude: it enters the budget through the floor ``(terms + 2)·eps_p·scale``, an a-priori
    allowance for a correct implementation rounding in another order whose constant is itself a
    count of operations, not a sharp bound, so a scale off by a relative ``r`` moves the floor by
    the factor ``1 ± r`` and nothing else (the measured term ``factor · err_p`` does not use it,
    and :func:`~vla_verify.error_model.compare` never lets the floor's magnitude fall below that
    of the judged reference itself).  The float64 history is trusted to that order of magnitude
    where ``REFERENCE_SAFETY · estimate <= SCALE_TRUST`` (= 1/2: every magnitude within a factor
    of two of the exact one, the estimate being first order like every scale it feeds).  Past it
    the float64 chain has lost its leading digits (on the strongly penalised six-token case,
    ``||u||`` ~ 1e8, its largest ``|A_t|`` is 563 where the exact one is 9.75), and the scales
    come from the escalated reference's own history
    (:func:`vla_verify.oracle.reference_history`: the reference of every prefix, affordable
    while the prefixes' total work is within its ``max_work``).  The example is beyond the
    reference's reach (:class:`_BeyondReach`) only where the escalated reference cannot vouch
    for its result (or its history).
    """
    q = inputs[0]
    B, T, H, dk = q.shape
    dv = inputs[2].shape[-1]
    segment = max(1, min(T, _HISTORY_BUDGET // max(1, B * H * dk * max(dk, dv))))
    whole = segment >= T  # one segment: its accuracy estimate is the whole run's
    scales = {
        "S": np.zeros((B, H)),
        "A": np.zeros((B, H)),
        "z": np.zeros((B, H)),
        "o": np.zeros((B, H)),
    }
    outputs = []
    state: Any = initial
    diagnostics = None
    for lo in range(0, T, segment):
        part = [x[:, lo : lo + segment] for x in inputs]
        try:
            run = recurrence(
                *part,
                config=config,
                variant=variant,
                initial_state=state,
                start=start + lo,
                return_states=True,
                diagnose=whole,
            )
        except IllConditionedError as exc:  # an oracle that refuses: beyond reach, as always
            raise _BeyondReach(str(exc)) from exc
        diagnostics = run.diagnostics
        history = run.history
        assert history is not None
        _add_scales(scales, history.S, history.A, history.z, part[0], config)
        outputs.append(run.o)
        state = run.state
        if not _finite(state) and lo + segment < T:
            # The float64 run overflowed: the oracle does not take a non-finite state to go on
            # (the estimate below is then infinite: escalated or beyond reach).
            outputs.append(np.full((B, T - lo - segment, H, dv), np.nan))
            break
    _add_initial_scales(scales, initial, config)
    assert state is not None
    kwargs: dict[str, Any] = dict(
        config=config, variant=variant, initial_state=initial, start=start
    )
    if not whole:
        try:
            diagnostics = recurrence(*inputs, diagnose=True, **kwargs).diagnostics
        except IllConditionedError as exc:
            raise _BeyondReach(str(exc)) from exc
    assert diagnostics is not None
    estimate = REFERENCE_SAFETY * diagnostics.estimate
    if estimate <= REFERENCE_RTOL:
        float64 = OracleResult(np.concatenate(outputs, axis=1), state, None)
        return float64.with_diagnostics(diagnostics), scales, None
    float64 = OracleResult(np.concatenate(outputs, axis=1), state, None)
    if estimate <= SCALE_TRUST:
        return _escalated(inputs, kwargs), scales, float64
    # The float64 history has lost its order of magnitude: the escalated reference's history
    # gives the scales, and its last step the values judged.
    try:
        exact = oracle_reference_history(*inputs, target_rtol=REFERENCE_RTOL, **kwargs)
    except IllConditionedError as exc:
        raise _BeyondReach(
            f"the float64 history has lost its order of magnitude (error estimate "
            f"{diagnostics.estimate:.3g}), and the escalated reference's cannot replace it: {exc}"
        ) from exc
    scales = {name: np.zeros((B, H)) for name in "SAzo"}
    _add_scales(scales, exact.S, exact.A, exact.z, inputs[0], config)
    _add_initial_scales(scales, initial, config)
    ref = OracleResult(exact.o, (exact.S[:, -1], exact.A[:, -1], exact.z[:, -1]), None)
    return ref, scales, float64


def _add_scales(
    scales: dict[str, np.ndarray],
    S: np.ndarray,
    A: np.ndarray,
    z: np.ndarray,
    q: np.ndarray,
    config: VLAConfig,
) -> None:
    """Raise ``scales`` (``[B, H]`` each) to the magnitudes of one stretch of history:
    ``S [B,t,H,dv,dk]``, ``A [B,t,H,dk,dk]``, ``z [B,t,H,dk]`` and its queries ``q [B,t,H,dk]``
    (see :func:`_reference_with_scales`)."""
    scales["S"] = np.maximum(scales["S"], np.max(np.abs(S), axis=(1, 3, 4)))
    scales["A"] = np.maximum(scales["A"], np.max(np.abs(A), axis=(1, 3, 4)))
    scales["z"] = np.maximum(scales["z"], np.max(np.abs(z), axis=(1, 3)))
    terms = (np.abs(S) @ np.abs(q)[..., None])[..., 0]  # [B, t, H, dv]
    if config.normalize_output:
        den = np.maximum(np.sum(z * q, axis=-1), config.out_eps)
        terms = terms / den[..., None]
    scales["o"] = np.maximum(scales["o"], np.max(terms, axis=(1, 3)))


def _add_initial_scales(
    scales: dict[str, np.ndarray], initial: tuple[np.ndarray, ...] | None, config: VLAConfig
) -> None:
    """Raise ``scales`` to the magnitudes of the initial state (given, or the default)."""
    if initial is not None:
        for name, x, axes in zip("SAz", initial, ((2, 3), (2, 3), (2,)), strict=True):
            scales[name] = np.maximum(scales[name], np.max(np.abs(x), axis=axes))
    else:  # the default start: S_0 = 0, z_0 = 0, A_0 = I/lambda0 (the first downdate cancels it)
        scales["A"] = np.maximum(scales["A"], 1.0 / config.lambda0)


# -- what fn returned ---------------------------------------------------------------------------


def _split_result(result: Any) -> tuple[Any, tuple[Any, Any, Any] | None]:
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], (tuple, list)):
        state = tuple(result[1])
        if len(state) != 3:
            raise TypeError(f"the returned state must be (S, A, z), got {len(state)} entries")
        return result[0], state  # type: ignore[return-value]
    return result, None


def _returned_problem(x: Any, array: str, dtype: str, device: str, name: str) -> tuple[str, str]:
    """``(kind, message)`` when ``x`` is not what was asked for, else ``("", "")``."""
    if array == "torch":
        if not is_torch(x):
            return "type", f"{name} is a {type(x).__name__}, expected a torch.Tensor"
        import torch

        if x.dtype != getattr(torch, dtype):
            return "dtype", f"{name} has dtype {x.dtype}, expected torch.{dtype} (the request)"
        wanted = torch.device(device)
        if x.device.type != wanted.type or (
            wanted.index is not None and x.device.index != wanted.index
        ):
            return "device", f"{name} is on device {x.device}, expected {device!r}"
        return "", ""
    if not isinstance(x, np.ndarray):
        return "type", f"{name} is a {type(x).__name__}, expected a numpy.ndarray"
    if x.dtype != np.dtype(dtype):
        return "dtype", f"{name} has dtype {x.dtype}, expected {dtype} (the request)"
    return "", ""


def _same_bits(given: Any, seen: np.ndarray) -> bool:
    now = to_numpy(given)
    return now.shape == seen.shape and bool(np.array_equal(now, seen, equal_nan=True))


def accepts_start(fn: Implementation) -> bool:
    """Whether ``fn`` takes the ``start`` keyword of spec §2.3 (registry backends all do)."""
    if isinstance(fn, Backend):
        return True
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    p = parameters.get("start")
    return p is not None and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)


def carry_cut(split: int, T: int, period: int | None, *, takes_start: bool = False) -> int | None:
    """Where the state-carry check cuts a sequence of ``T`` tokens, or None if no cut is valid.

    An implementation that takes ``start`` (spec §2.3) continues the nudge clock from it, so any
    cut ``1 <= cut < T`` is valid: ``split`` itself, clamped.  One without ``start`` restarts the
    clock at each call, so a suffix started from a carried state only continues the whole
    sequence when the cut is a multiple of ``nudge_period`` or no nudge falls after it.
    """
    if T < 2:
        return None
    clamped = min(max(split, 1), T - 1)
    if takes_start or period is None or T < period:
        return clamped
    cut = period * max(1, round(split / period))
    while cut >= T:
        cut -= period
    return cut if cut >= 1 else None


# -- one example --------------------------------------------------------------------------------


@dataclass
class _Outcome:
    status: str  # "judged" | "outside" (an oracle not finite, or the exact result beyond the
    # dtype's range) | "beyond" (IllConditioned)
    failure: Failure | None = None
    ratio: float = 0.0
    note: str | None = None


def _evaluate(
    fn: Implementation,
    case: Case,
    *,
    config: VLAConfig,
    variant: str,
    array: str,
    dtype: str,
    device: str,
    factor: float,
    check_carry: bool,
    chunk_size: int | None,
    takes_start: bool,
) -> _Outcome:
    def fail(kind: str, message: str, comparisons: Any = (), tb: str | None = None, cut=None):
        failure = Failure(kind, message, case, list(comparisons), tb, config, cut)
        return _Outcome("judged", failure, np.inf)

    def fresh(xs: Sequence[np.ndarray]) -> list[Any]:
        # A new copy per call: fn may not modify what it is given, and must not be able to
        # change the arrays the report shows.
        return [from_numpy(np.array(x, copy=True), array, dtype, device) for x in xs]

    drawn = [case.q, case.k, case.v, case.u]
    # The exact values fn sees, in float64: the reference is computed from these.
    seen = [to_numpy(x) for x in fresh(drawn)]
    seen_state = (
        None
        if case.initial_state is None
        else tuple(to_numpy(x) for x in fresh(case.initial_state))
    )
    try:
        ref, scales, measured = _reference_with_scales(seen, seen_state, config, variant)
        base_runs = same_precision_runs(
            seen,
            seen_state,
            config=config,
            variant=variant,
            dtype=dtype,
            seed=case.seed,
            samples=baseline_samples(case.shapes[1]),
        )
    except _BeyondReach as exc:
        return _Outcome("beyond", note=str(exc))
    if not _finite([ref.o, *ref.state, *(x for r in base_runs for x in (r.o, *r.state))]):
        return _Outcome("outside")
    # An exact result beyond the dtype's range: correctly rounded, it is infinite, so no
    # implementation in that precision can be judged on it (the same-precision oracle, which
    # rounds every operation, can stay finite there by its own errors).
    if not _representable([ref.o, *ref.state], dtype):
        return _Outcome("outside")
    B, T, H, dk, dv = case.shapes
    names = ("q", "k", "v", "u", "S0", "A0", "z0")

    def call(
        inputs: list[np.ndarray],
        state: tuple[Any, ...] | None,
        start: int = 0,
        label: str = "",
        *,
        drawn_state: bool = False,
    ) -> tuple[Any, Any] | _Outcome:
        """Call fn on fresh copies of ``inputs`` (and of ``state`` when it is a drawn, float64
        one); a failure when fn raises or changes what it was given."""
        given = fresh(inputs)
        checked = list(inputs)
        given_state: tuple[Any, ...] | None
        if drawn_state and state is not None:
            copies = tuple(fresh(state))
            given.extend(copies)
            checked.extend(state)
            given_state = copies
        elif state is not None:
            # fn's own returned state, carried into the second half: fn gets copies of it too,
            # so that changing them in place is reported as such, not as a carry failure.
            snapshots = [None if x is None else np.array(to_numpy(x), copy=True) for x in state]
            copies = tuple(
                None if x is None else from_numpy(np.array(x, copy=True), array, dtype, device)
                for x in snapshots
            )
            given.extend(copies)
            checked.extend(snapshots)  # type: ignore[arg-type]
            given_state = copies
        else:
            given_state = None
        extra = {"start": start} if start else {}
        try:
            result = fn(*given[:4], config=config, initial_state=given_state, **extra)
            out = _split_result(result)
        except KeyboardInterrupt:
            raise
        except UnsupportedConfigurationError:
            if start:
                raise  # a kernel that declines this start: the caller falls back
            tb = traceback.format_exc()
            return fail("crash", f"fn raised{label}: {tb.strip().splitlines()[-1]}", tb=tb)
        except BaseException as exc:  # SystemExit included: whatever fn raises is its failure
            return fail(
                "crash",
                f"fn raised {type(exc).__name__}{label}: {exc}",
                tb=traceback.format_exc(),
            )
        changed = [
            n
            for n, x, s in zip(names, given, checked, strict=False)
            if s is not None and not _same_bits(x, s)
        ]
        if changed:
            return fail(
                "in_place",
                f"fn modified its input(s) {', '.join(changed)} in place{label} (the report "
                "shows the inputs as drawn)",
            )
        return out

    whole = call(seen, seen_state, drawn_state=True)
    if isinstance(whole, _Outcome):
        return whole
    o, state = whole
    expected_shapes = {
        "o": (B, T, H, dv),
        "S": (B, H, dv, dk),
        "A": (B, H, dk, dk),
        "z": (B, H, dk),
    }
    outputs = {"o": o}
    if state is not None:
        outputs.update({n: x for n, x in zip("SAz", state, strict=True) if x is not None})
    refs = {"o": ref.o, "S": ref.state[0], "A": ref.state[1], "z": ref.state[2]}
    bases = {
        "o": [r.o for r in base_runs],
        "S": [r.state[0] for r in base_runs],
        "A": [r.state[1] for r in base_runs],
        "z": [r.state[2] for r in base_runs],
    }
    # Where the reference is escalated, the float64 oracle's own error is measured against it.
    own = (
        {}
        if measured is None
        else {
            "o": measured.o,
            "S": measured.state[0],
            "A": measured.state[1],
            "z": measured.state[2],
        }
    )
    # The floor's summation length (error_model.py): the recurrence's longest inner product has
    # dk terms; a chunked form also sums over up to C tokens of its chunk (spec §5).
    terms = dk + (chunk_size or 0)
    comparisons = []
    for name, x in outputs.items():
        kind, problem = _returned_problem(x, array, dtype, device, name)
        if kind:
            return fail(kind, problem)
        got = to_numpy(x)
        if got.shape != expected_shapes[name]:
            return fail("shape", f"{name} has shape {got.shape}, expected {expected_shapes[name]}")
        comparisons.append(
            compare(
                name,
                got,
                refs[name],
                bases[name],
                dtype,
                factor=factor,
                scale=scales.get(name),
                terms=terms,
                measured=own.get(name),
            )
        )
    bad = [c for c in comparisons if not c.passed]
    if bad:
        kind = "nonfinite" if any(not np.all(np.isfinite(c.error)) for c in bad) else "mismatch"
        which = ", ".join(c.name for c in bad)
        return fail(kind, f"{which} outside the error budget", comparisons)
    worst = max(c.ratio for c in comparisons)

    note = None
    cut = carry_cut(case.split, T, config.nudge_period, takes_start=takes_start)
    if check_carry and state is not None and cut is not None:
        carried = _carry(call, case, seen, seen_state, cut, takes_start, config, variant, fresh)
        if isinstance(carried, _Outcome):
            return carried
        if isinstance(carried, str):  # fn declined start=cut: cut on a period instead
            note = carried
            cut = carry_cut(case.split, T, config.nudge_period, takes_start=False)
            carried = (
                None
                if cut is None
                else _carry(call, case, seen, seen_state, cut, False, config, variant, fresh)
            )
            if isinstance(carried, _Outcome):
                return carried
        if isinstance(carried, tuple):
            judged = _judge_carry(
                carried, seen, cut, ref, bases, own.get("o"), scales, expected_shapes, config,
                variant, dtype, factor, terms, case,
            )  # fmt: skip
            if judged.status != "judged" or judged.failure is not None:
                if judged.failure is not None:
                    how = f" with start={cut}" if takes_start and note is None else ""
                    judged.failure.message = judged.failure.message.replace("{how}", how)
                return judged
            worst = max(worst, judged.ratio)
    return _Outcome("judged", None, worst, note)


def _carry(
    call: Callable[..., Any],
    case: Case,
    seen: list[np.ndarray],
    seen_state: tuple[np.ndarray, ...] | None,
    cut: int,
    takes_start: bool,
    config: VLAConfig,
    variant: str,
    fresh: Callable[[Sequence[np.ndarray]], list[Any]],
) -> tuple[Any, Any, tuple[Any, ...]] | _Outcome | str | None:
    """Run the two halves of the state-carry check: ``(o1, o2, state1)``, a failure, or a note
    (a str) when ``fn`` declines ``start=cut`` with :class:`UnsupportedConfigurationError`."""
    label = " during the state-carry check"
    first = call([x[:, :cut] for x in seen], seen_state, 0, label, drawn_state=True)
    if isinstance(first, _Outcome):
        return first
    o1, state1 = first
    if state1 is None:
        failure = Failure(
            "crash",
            "fn returned a state for the whole sequence but not for a prefix",
            case,
            config=config,
            cut=cut,
        )
        return _Outcome("judged", failure, np.inf)
    if any(x is None for x in state1):
        # fn does not keep some entry (e.g. A for a delta-rule kernel): carry the oracle's.
        try:
            prefix = _reference(
                [x[:, :cut] for x in seen], seen_state, config=config, variant=variant
            )
        except _BeyondReach as exc:
            return _Outcome("beyond", note=str(exc))
        filled = fresh(prefix.state)
        state1 = tuple(f if s is None else s for s, f in zip(state1, filled, strict=True))
    try:
        second = call([x[:, cut:] for x in seen], tuple(state1), cut if takes_start else 0, label)
    except UnsupportedConfigurationError:
        # One note for every declined cut: the registry's reason names the cut, the note not.
        return (
            "fn declines a start off a multiple of nudge_period (UnsupportedConfigurationError):"
            " where it does, its carry is checked at a cut on a multiple of nudge_period"
        )
    if isinstance(second, _Outcome):
        return second
    return o1, second[0], tuple(state1)


def _judge_carry(
    carried: tuple[Any, Any, tuple[Any, ...]],
    seen: list[np.ndarray],
    cut: int,
    ref: OracleResult,
    bases: dict[str, list[np.ndarray]],
    measured_o: np.ndarray | None,
    scales: dict[str, np.ndarray],
    expected_shapes: dict[str, tuple[int, ...]],
    config: VLAConfig,
    variant: str,
    dtype: str,
    factor: float,
    terms: int,
    case: Case,
) -> _Outcome:
    """Judge the two halves of the state carry (spec §4).

    The first half must give the whole sequence's first ``cut`` outputs.  The second half must
    give what the recurrence gives when continued from the state ``fn`` returned (the oracle
    started from that state, as ``fn`` returned it, with ``start=cut``), within the budget of
    that continuation.  Judging the second half against the continuation of ``fn``'s own state,
    rather than against the whole sequence, keeps the rounding of that state to ``fn``'s dtype
    (bfloat16 keeps 8 bits) out of the verdict; whether the state itself is right is judged
    where ``fn`` returns it for the whole sequence.  The ``{how}`` placeholder of a failure's
    message is filled by the caller.
    """

    def fail(message: str, comparisons: Any = ()) -> _Outcome:
        failure = Failure("carry", message, case, list(comparisons), None, config, cut)
        return _Outcome("judged", failure, np.inf)

    o1, o2, state1 = carried
    B, T, H, dv = expected_shapes["o"]
    got1, got2 = to_numpy(o1), to_numpy(o2)
    if got1.shape != (B, cut, H, dv) or got2.shape != (B, T - cut, H, dv):
        failure = Failure(
            "shape",
            f"carried outputs have shapes {got1.shape} and {got2.shape}, expected "
            f"{(B, cut, H, dv)} and {(B, T - cut, H, dv)}",
            case,
            config=config,
            cut=cut,
        )
        return _Outcome("judged", failure, np.inf)
    carried_state = tuple(to_numpy(x) for x in state1)
    for name, x in zip("SAz", carried_state, strict=True):
        if x.shape != expected_shapes[name]:
            failure = Failure(
                "shape",
                f"the state returned after token {cut}: {name} has shape {x.shape}, expected "
                f"{expected_shapes[name]}",
                case,
                config=config,
                cut=cut,
            )
            return _Outcome("judged", failure, np.inf)
    first = compare(
        "o",
        got1,
        ref.o[:, :cut],
        [b[:, :cut] for b in bases["o"]],
        dtype,
        factor=factor,
        scale=scales["o"],
        terms=terms,
        measured=None if measured_o is None else measured_o[:, :cut],
    )
    if not first.passed:
        return fail(f"the first {cut} tokens, run alone, differ from the whole sequence's", [first])
    if not _finite(carried_state):
        return fail(f"the state fn returned after token {cut} is not finite")
    second_inputs = [x[:, cut:] for x in seen]
    try:
        ref2, scales2, measured2 = _reference_with_scales(
            second_inputs, carried_state, config, variant, start=cut
        )
        bases2 = same_precision_runs(
            second_inputs,
            carried_state,
            config=config,
            variant=variant,
            dtype=dtype,
            seed=case.seed + 1,
            samples=baseline_samples(T - cut),
            start=cut,
        )
    except _BeyondReach as exc:
        return _Outcome("beyond", note=str(exc))
    if not _finite([ref2.o, *(r.o for r in bases2)]):
        return _Outcome("judged", None, first.ratio)  # the continuation is outside the envelope
    second = compare(
        "o",
        got2,
        ref2.o,
        [r.o for r in bases2],
        dtype,
        factor=factor,
        scale=scales2["o"],
        terms=terms,
        measured=None if measured2 is None else measured2.o,
    )
    if not second.passed:
        return fail(
            f"the sequence cut after token {cut} and continued from the state fn returned"
            "{how} differs from the recurrence continued from that state",
            [second],
        )
    return _Outcome("judged", None, max(first.ratio, second.ratio))


def evaluate_case(
    fn: Implementation,
    case: Case,
    *,
    config: VLAConfig,
    variant: str = "vla",
    array: str = "numpy",
    dtype: str = "float64",
    device: str = "cpu",
    factor: float = DEFAULT_FACTOR,
    check_carry: bool = True,
    chunk_size: int | None = None,
) -> tuple[Failure | None, float] | None:
    """Check ``fn`` on one case.  Returns ``(failure or None, worst error/budget)``, or ``None``
    when the case says nothing about ``fn``: the oracle itself is not finite in ``fn``'s
    precision (outside that precision's envelope) or the reference cannot vouch for its result
    (:class:`~vla_verify.errors.IllConditionedError`)."""
    outcome = _evaluate(
        fn,
        case,
        config=config,
        variant=variant,
        array=array,
        dtype=dtype,
        device=device,
        factor=factor,
        check_carry=check_carry,
        chunk_size=chunk_size,
        takes_start=accepts_start(fn),
    )
    if outcome.status != "judged":
        return None
    return outcome.failure, outcome.ratio


# -- arguments ----------------------------------------------------------------------------------


def _positive_int(value: Any, argument: str, *, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        expected = "a positive integer" + (" or None" if allow_none else "")
        raise VLAInputError(argument, f"expected {expected}, got {value!r}")
    return int(value)


def _head_dims(
    value: Any, max_dk: int | None, bounds: ShapeBounds | None
) -> tuple[int, ...] | None:
    """``validate``'s ``head_dims`` checked: ``None``, or the distinct positive widths in the
    order given; an error where ``max_dk`` or ``bounds`` sets the widths as well."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not value:
        raise VLAInputError(
            "head_dims", f"expected a non-empty sequence of positive integers, got {value!r}"
        )
    for width in value:
        if isinstance(width, bool) or not isinstance(width, numbers.Integral) or width < 1:
            raise VLAInputError(
                "head_dims", f"expected positive integer widths, got {width!r} in {value!r}"
            )
    if max_dk is not None:
        raise VLAInputError(
            "head_dims", f"give head_dims or max_dk, not both (got max_dk={max_dk!r})"
        )
    if bounds is not None:
        raise VLAInputError(
            "head_dims", "give head_dims or bounds, not both (bounds sets the widths itself)"
        )
    return tuple(dict.fromkeys(int(w) for w in value))


def _resolve_fn(fn: Any, variant: str) -> Implementation:
    """``fn`` itself, or the callable a string names: ``"package.module:function"`` or a
    registry backend name (``"torch"``)."""
    if isinstance(fn, str):
        module_name, sep, attr = fn.partition(":")
        if not sep:
            from .backends import get
            from .errors import UnknownBackendError

            try:
                return get(fn, variant=variant)
            except UnknownBackendError:
                raise VLAInputError(
                    "fn", f"expected a callable, 'module:function' or a backend name, got {fn!r}"
                ) from None
        if not module_name or not attr:
            raise VLAInputError("fn", f"expected 'package.module:function', got {fn!r}")
        try:
            obj: Any = importlib.import_module(module_name)
        except ImportError as exc:
            raise VLAInputError("fn", f"cannot import {module_name!r}: {exc}") from None
        for part in attr.split("."):
            if not hasattr(obj, part):
                raise VLAInputError("fn", f"{module_name!r} has no attribute {attr!r}")
            obj = getattr(obj, part)
        fn = obj
    if not callable(fn):
        raise VLAInputError(
            "fn",
            "expected a callable fn(q, k, v, u, *, config, initial_state=None), "
            f"'module:function' or a backend name, got {fn!r}",
        )
    return fn


def _resolve_config(config: Any) -> VLAConfig:
    """A :class:`VLAConfig`, ``None`` (the paper preset) or a mapping of its fields, from which
    one is built (every field validated; an unknown field is a :class:`ConfigError`)."""
    if config is None:
        return VLAConfig()
    if isinstance(config, VLAConfig):
        return config
    if isinstance(config, Mapping):
        fields = set(VLAConfig.__dataclass_fields__)
        unknown = sorted(set(map(str, config)) - fields)
        if unknown:
            raise ConfigError("config", f"unknown field(s) {unknown}; fields are {sorted(fields)}")
        return VLAConfig(**dict(config))
    raise ConfigError(
        "config", f"expected a VLAConfig, a mapping of its fields or None, got {config!r}"
    )


def _check_usage(array: str, dtype: str, device: str) -> None:
    if array not in ARRAY_LIBRARIES:
        raise VLAInputError("array", f"expected one of {ARRAY_LIBRARIES}, got {array!r}")
    if not isinstance(dtype, str) or dtype not in array_dtypes(array):
        raise DTypeError("dtype", f"array={array!r} supports {array_dtypes(array)}, got {dtype!r}")
    if not isinstance(device, str):
        raise DeviceError("device", f"expected a device name such as 'cpu', got {device!r}")
    if array == "numpy" and device != "cpu":
        raise DeviceError("device", f"NumPy arrays live on 'cpu', got {device!r}")
    if array == "torch":
        try:
            import torch
        except ImportError:
            raise VLAInputError(
                "array", "array='torch' needs PyTorch, which is not installed"
            ) from None
        try:
            torch.empty(1, device=device)
        except Exception as exc:
            raise DeviceError("device", f"cannot allocate on device {device!r}: {exc}") from None


def _target_of(fn: Implementation) -> str | None:
    """A string :func:`validate` resolves back to ``fn`` (for the replay line), if there is one."""
    if isinstance(fn, Backend):
        defaults = fn.capabilities.options
        return fn.name if fn.options == defaults else None
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if not module or not qualname or "<" in qualname or module == "__main__":
        return None
    try:
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return None
    return f"{module}:{qualname}" if obj is fn else None


# -- counterexample files -------------------------------------------------------------------


def _save_failure(
    failure: Failure, directory: str | Path, settings_: dict[str, Any], target_: str | None
) -> None:
    """Write the failing case and everything needed to rerun it; set the replay line."""
    arrays = {name: np.asarray(x) for name, x in failure.case.arrays().items()}
    config = failure.config if failure.config is not None else VLAConfig()
    meta = {
        **settings_,
        "config": asdict(config),
        "split": failure.case.split,
        "regimes": failure.case.regimes,
        "value_seed": failure.case.seed,
        "target": target_,
    }
    digest = hashlib.sha1(json.dumps(meta, sort_keys=True, default=str).encode())
    for x in arrays.values():
        digest.update(np.ascontiguousarray(x).tobytes())
    name = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in (target_ or "fn"))
    path = Path(directory) / f"{name[:60]}-{digest.hexdigest()[:12]}.npz"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(path, meta=np.array(json.dumps(meta, default=str)), **arrays)  # type: ignore[arg-type]
    except OSError as exc:  # a read-only directory must not hide the failure itself
        failure.replay_line = f"(could not save the case to {path}: {exc})"
        return
    failure.replay_path = str(path)
    if target_ is not None:
        failure.replay_line = f"vla-verify check {target_} --replay {path}"
    else:
        failure.replay_line = f"vla_verify.validation.replay({str(path)!r}, fn)"


def load_case(path: str | Path) -> tuple[Case, dict[str, Any]]:
    """The case and the settings a failure file of :func:`validate` holds."""
    with np.load(path, allow_pickle=False) as data:
        meta = json.loads(str(data["meta"]))
        arrays = {name: np.array(data[name]) for name in data.files if name != "meta"}
    state = None
    if "S0" in arrays:
        state = (arrays["S0"], arrays["A0"], arrays["z0"])
    case = Case(
        arrays["q"],
        arrays["k"],
        arrays["v"],
        arrays["u"],
        state,
        int(meta["split"]),
        dict(meta["regimes"]),
        int(meta["value_seed"]),
    )
    return case, meta


def replay(path: str | Path, fn: Implementation | str | None = None) -> ValidationReport:
    """Rerun exactly the case a failure file of :func:`validate` saved, with the same
    configuration, variant, array library, dtype, device, factor and chunk length.

    ``fn`` defaults to the target the file records (``"module:function"`` or a backend name).
    Returns a :class:`ValidationReport` of that one example.
    """
    if not isinstance(path, (str, Path)) or not Path(path).is_file():
        raise VLAInputError("path", f"expected a failure file written by validate, got {path!r}")
    case, meta = load_case(path)
    if fn is None:
        fn = meta.get("target")
        if fn is None:
            raise VLAInputError("fn", "the file records no importable target: pass fn")
    fn = _resolve_fn(fn, meta["variant"])
    if isinstance(fn, Backend) and fn.variant != meta["variant"]:
        fn = fn.bind(variant=meta["variant"])
    config = VLAConfig(**meta["config"])
    start = time.perf_counter()
    outcome = _evaluate(
        fn,
        case,
        config=config,
        variant=meta["variant"],
        array=meta["array"],
        dtype=meta["dtype"],
        device=meta["device"],
        factor=float(meta["factor"]),
        check_carry=bool(meta["check_carry"]),
        chunk_size=meta["chunk_size"],
        takes_start=accepts_start(fn),
    )
    failures = [] if outcome.failure is None else [outcome.failure]
    for f in failures:
        f.replay_path = str(path)
    return ValidationReport(
        passed=not failures,
        failures=failures,
        examples=1,
        rejected=int(outcome.status == "outside"),
        worst_ratio=float(outcome.ratio if outcome.failure is None else 0.0),
        variant=meta["variant"],
        array=meta["array"],
        dtype=meta["dtype"],
        device=meta["device"],
        seed=meta.get("seed"),
        elapsed_s=time.perf_counter() - start,
        name=str(meta.get("target") or getattr(fn, "__qualname__", "fn")),
        chunk_size=meta["chunk_size"],
        beyond_reach=int(outcome.status == "beyond"),
        notes=[f"replay of {path}"] + ([outcome.note] if outcome.note else []),
        replayed=True,
    )


# -- validate ---------------------------------------------------------------------------------


def validate(
    fn: Implementation | str,
    *,
    config: VLAConfig | Mapping[str, Any] | None = None,
    variant: str = "vla",
    array: str | None = None,
    dtype: str = "float64",
    device: str = "cpu",
    max_examples: int | None = None,
    seed: int | None = None,
    factor: float = DEFAULT_FACTOR,
    bounds: ShapeBounds | None = None,
    check_carry: bool = True,
    chunk_size: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    max_dk: int | None = None,
    max_T: int | None = None,
    max_batch: int | None = None,
    configs: str = "given",
    profile: str = "default",
    failure_dir: str | Path | None = None,
    head_dims: Sequence[int] | None = None,
) -> ValidationReport:
    """Check ``fn`` (spec §4) against the float64 oracle on Hypothesis-generated inputs.

    Every argument is checked before any example runs; a wrong one raises a
    :class:`~vla_verify.errors.VLAInputError` subclass naming it.

    Parameters
    ----------
    fn : callable ``fn(q, k, v, u, *, config, initial_state=None[, start=0]) -> o | (o, (S, A,
        z))``, or a string naming one: ``"package.module:function"`` or a registry backend name.
        A registry :class:`~vla_verify.backends.Backend` is bound to ``variant`` automatically.
        When ``fn`` takes ``start`` (spec §2.3), the state-carry check cuts anywhere and passes
        ``start=cut``; otherwise it cuts at multiples of ``nudge_period`` only (the report says
        so).
    config : the configuration ``fn`` implements (default: the paper preset); a mapping of
        :class:`VLAConfig` fields is accepted and validated like ``VLAConfig(**config)``.
    variant : which recurrence ``fn`` implements (``vla``, ``rls``, ``delta``, ``linear``).
    array, dtype, device : what ``fn`` is fed (``numpy`` or ``torch``, default: a registry
        backend's own library, else ``numpy``; any float dtype the library holds; a torch device
        string), and what it must return.
    max_examples : Hypothesis examples to try (shrinking comes on top); default: the profile's.
    seed : Hypothesis seed; ``None`` draws one and records it in the report.
    factor : the spec §4 factor over the same-precision oracle's error (default 2; > 0).
    bounds : the sizes of the property tests' :func:`~vla_verify.properties.strategies.cases`
        instead of the conformance sizes (``max_dk``, ``max_T``, ``max_batch``, ``head_dims``
        then unused; giving ``head_dims`` as well is an error).
    check_carry : also check state carry when ``fn`` returns a state.
    chunk_size : for a chunked implementation (spec §5), its chunk length ``C``: lengths and
        carry cuts aim at multiples of ``C`` and ``C ± 1``, and its inner products run over up
        to ``dk + C`` terms, so the float32/float64 floor of :mod:`vla_verify.error_model` grows
        accordingly (the factor does not change).  A bound registry backend with a
        ``chunk_size`` option declares it itself.
    progress : called as ``progress(examples_done, max_examples)``.
    max_dk, max_T, max_batch : the largest head width (``dk`` and ``dv``, default 128), length
        (default 640) and ``B·H`` (default 6) drawn
        (:class:`~vla_verify.properties.strategies.ConformanceSizes`).
    configs : ``"given"`` checks ``config`` only; ``"sweep"`` also draws configurations
        (:func:`~vla_verify.properties.strategies.swept_configs`), so that a kernel ignoring a
        field of :class:`VLAConfig` is caught.
    profile : ``"quick"`` (25 examples), ``"default"`` (100) or ``"thorough"`` (1000):
        the default of ``max_examples`` (:data:`PROFILES`).
    failure_dir : where a failing case is saved for :func:`replay` (default
        ``$VLA_VERIFY_FAILURE_DIR`` or ``vla-verify-failures`` in the temporary directory).
    head_dims : the only head widths drawn, for ``dk`` and ``dv`` alike (e.g. ``(64, 128)``,
        the widths a kernel supports or ships): every example then runs at them, where the
        default mix up to ``max_dk`` draws small and ragged widths most often and reaches a
        given width only with many examples.  Shrinking moves to the first.  Default: the mix;
        giving ``max_dk`` as well is an error.

    Returns
    -------
    ValidationReport
        ``.passed``, ``.failures`` (each with the shrunk input, expected vs got, error and
        budget with its terms, and a replay line) and ``.summary()``.
    """
    # -- arguments, all of them before any work --------------------------------------------------
    check_variant(variant)
    fn = _resolve_fn(fn, variant)
    config = _resolve_config(config)
    if array is None:
        array = fn.capabilities.array if isinstance(fn, Backend) else "numpy"
    _check_usage(array, dtype, device)
    if profile not in PROFILES:
        raise VLAInputError("profile", f"expected one of {tuple(PROFILES)}, got {profile!r}")
    max_examples = _positive_int(
        PROFILES[profile] if max_examples is None else max_examples, "max_examples"
    )
    assert max_examples is not None
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)):
        raise VLAInputError("seed", f"expected an integer or None, got {seed!r}")
    if (
        isinstance(factor, bool)
        or not isinstance(factor, numbers.Real)
        or not math.isfinite(factor)
        or factor <= 0
    ):
        raise VLAInputError("factor", f"expected a finite number > 0, got {factor!r}")
    if bounds is not None and not isinstance(bounds, ShapeBounds):
        raise VLAInputError("bounds", f"expected a ShapeBounds or None, got {bounds!r}")
    if not isinstance(check_carry, bool):
        raise VLAInputError("check_carry", f"expected True or False, got {check_carry!r}")
    chunk_size = _positive_int(chunk_size, "chunk_size", allow_none=True)
    if progress is not None and not callable(progress):
        raise VLAInputError("progress", f"expected a callable or None, got {progress!r}")
    sizes = ConformanceSizes(
        max_dk=_positive_int(max_dk, "max_dk", allow_none=True) or 128,
        max_T=_positive_int(max_T, "max_T", allow_none=True) or 640,
        max_batch=_positive_int(max_batch, "max_batch", allow_none=True) or 6,
    )
    if configs not in ("given", "sweep"):
        raise VLAInputError("configs", f"expected 'given' or 'sweep', got {configs!r}")
    head_dims = _head_dims(head_dims, max_dk, bounds)
    if failure_dir is not None and not isinstance(failure_dir, (str, Path)):
        raise VLAInputError("failure_dir", f"expected a path or None, got {failure_dir!r}")
    failure_dir = failure_dir or os.environ.get(FAILURE_DIR_ENV) or DEFAULT_FAILURE_DIR

    support: Callable[[VLAConfig, Shapes], str | None] | None = None
    if isinstance(fn, Backend):
        if fn.variant != variant:
            fn = fn.bind(variant=variant)
        backend = fn
        reason = backend.check_support(config, Shapes(1, 1, 1, 1, 1), dtype, device)
        if reason is not None:  # the request itself is unsupported, whatever the shapes
            raise UnsupportedConfigurationError(backend.name, reason)
        unavailable = backend.availability()
        if unavailable is not None:  # a missing device is not a failure of the implementation
            raise BackendUnavailableError(backend.name, unavailable)

        def support(cfg: VLAConfig, shapes: Shapes) -> str | None:
            return backend.check_support(cfg, shapes, dtype, device)

        if chunk_size is None:
            chunk_size = backend.options.get("chunk_size")
    sizes = ConformanceSizes(
        max_dk=sizes.max_dk,
        max_T=sizes.max_T,
        max_batch=sizes.max_batch,
        chunk_size=chunk_size,
        head_dims=head_dims,
    )
    takes_start = accepts_start(fn)

    if seed is None:
        seed = int.from_bytes(os.urandom(4), "little")
    counters: dict[str, Any] = {"examples": 0, "rejected": 0, "beyond": 0, "worst": 0.0}
    notes: set[str] = set()
    case_strategy = (
        cases(config, bounds) if bounds is not None else conformance_cases(config, sizes)
    )
    config_strategy = swept_configs(config, variant) if configs == "sweep" else st.just(config)

    @hypothesis_seed(seed)
    @settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        derandomize=False,
        report_multiple_bugs=False,
        print_blob=False,
        suppress_health_check=list(HealthCheck),
        # Every phase but the explanation: the report describes the shrunk case itself, and
        # explaining it reruns fn and the reference on a hundred or so variations of it.
        phases=[p for p in Phase if p != Phase.explain],
    )
    @given(cfg=config_strategy, case=case_strategy)
    def check(cfg: VLAConfig, case: Case) -> None:
        if support is not None and support(cfg, Shapes(*case.shapes)) is not None:
            reject()
        outcome = _evaluate(
            fn,
            case,
            config=cfg,
            variant=variant,
            array=array,
            dtype=dtype,
            device=device,
            factor=factor,
            check_carry=check_carry,
            chunk_size=chunk_size,
            takes_start=takes_start,
        )
        counters["examples"] += 1
        if progress is not None:
            progress(min(counters["examples"], max_examples), max_examples)
        if outcome.status == "outside":
            counters["rejected"] += 1
            reject()
        if outcome.status == "beyond":
            counters["beyond"] += 1
            reject()
        if outcome.note:
            notes.add(outcome.note)
        if outcome.failure is not None:
            raise _CheckFailed(outcome.failure)
        counters["worst"] = max(counters["worst"], outcome.ratio)
        # Steer the search towards the examples closest to failing.
        target(float(min(outcome.ratio, 1e6)), label="error/budget")

    start = time.perf_counter()
    failures: list[Failure] = []
    try:
        check()
    except _CheckFailed as exc:
        failures.append(exc.failure)
    except Flaky as exc:  # fn is non-deterministic: report it, do not hide it
        failures.append(
            Failure(
                "crash",
                f"fn gave different verdicts on the same input (flaky): {exc}",
                Case(*(np.zeros((1, 1, 1, 1)),) * 4, None, 1),
            )
        )
    target_ = _target_of(fn)
    for failure in failures:
        _save_failure(
            failure,
            failure_dir,
            {
                "variant": variant,
                "array": array,
                "dtype": dtype,
                "device": device,
                "factor": factor,
                "check_carry": check_carry,
                "chunk_size": chunk_size,
                "seed": seed,
            },
            target_,
        )
    if not takes_start and check_carry:
        notes.add(
            "fn takes no `start` keyword (spec §2.3): its state carry is checked at cuts on "
            "multiples of nudge_period only"
        )
    name = getattr(fn, "__qualname__", None) or repr(fn)
    return ValidationReport(
        passed=not failures,
        failures=failures,
        examples=counters["examples"],
        rejected=counters["rejected"],
        worst_ratio=float(counters["worst"]),
        variant=variant,
        array=array,
        dtype=dtype,
        device=device,
        seed=seed,
        elapsed_s=time.perf_counter() - start,
        name=name if isinstance(name, str) else repr(fn),
        chunk_size=chunk_size,
        beyond_reach=counters["beyond"],
        configs=configs,
        notes=sorted(notes),
        head_dims=head_dims,
    )
