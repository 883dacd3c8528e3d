"""``validate(fn)``: drive Hypothesis-generated inputs through an implementation and the oracle.

``fn`` follows spec §4: ``fn(q, k, v, u, *, config, initial_state=None)`` returning ``o`` or
``(o, (S, A, z))`` (any entry of the state may be ``None`` when the implementation does not keep
it).  Each example:

1. draws inputs from :func:`vla_verify.properties.strategies.cases` (the hard corners: nearly
   parallel keys, ill-conditioned penalties, tiny read-out denominators, ``dk != dv``, B, H > 1,
   several nudge periods, given initial states);
2. converts them to the requested array library, dtype and device, and reads back the exact values
   ``fn`` sees, so the reference is computed from the same rounded inputs;
3. runs the float64 oracle (the reference) and the oracle in ``fn``'s precision (the baseline of
   :mod:`vla_verify.error_model`, three runs with different rounding: :func:`same_precision_runs`);
4. compares ``o`` and every returned state entry slice by slice against the budget; and, when
   ``fn`` returns a state, checks *state carry*: the sequence cut in two, the second half started
   from the state ``fn`` returned for the first, must give the whole sequence's output.

A wrong or crashing ``fn`` never raises: it is a failure in the report, with Hypothesis's shrunk
counterexample.  Only misuse of ``validate`` itself (an unknown variant, a dtype the array library
cannot hold, a device that does not exist) raises a :class:`~vla_verify.errors.VLAInputError`.
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.errors import Flaky

from .arrays import ARRAY_LIBRARIES, array_dtypes, from_numpy, is_torch, to_numpy
from .backends.numpy_oracle import OracleResult, recurrence
from .backends.registry import Backend
from .error_model import DEFAULT_FACTOR, SliceComparison, compare
from .errors import (
    BackendUnavailableError,
    DeviceError,
    DTypeError,
    UnsupportedConfigurationError,
    VLAInputError,
)
from .properties.strategies import Case, ShapeBounds, cases
from .spec import Shapes, VLAConfig, check_variant, unit_roundoff

__all__ = ["Failure", "ValidationReport", "evaluate_case", "same_precision_runs", "validate"]

#: Runs of the same-precision oracle per example (see :func:`same_precision_runs`).
BASELINE_SAMPLES = 8

Implementation = Callable[..., Any]


@dataclass
class Failure:
    """One failing example: what went wrong, on which (shrunk) input, by how much."""

    kind: str  # "mismatch" | "carry" | "crash" | "shape" | "nonfinite" | "type"
    message: str
    case: Case
    comparisons: list[SliceComparison] = field(default_factory=list)
    traceback: str | None = None

    def describe(self) -> str:
        lines = [f"[{self.kind}] {self.message}", f"  input: {self.case.describe()}"]
        for c in self.comparisons:
            if c.passed:
                continue
            b, h = np.unravel_index(int(np.argmax(c.error - c.budget)), c.error.shape)
            lines.append(
                f"  {c.name}: max error {c.error[b, h]:.3e} > budget {c.budget[b, h]:.3e} "
                f"in slice (b={b}, h={h}); worst element {c.name}{list(c.worst_index)}: "
                f"got {c.got_at_worst:.17g}, expected {c.ref_at_worst:.17g}"
            )
        if self.traceback:
            lines.append("  traceback (last lines):")
            lines.extend("    " + ln for ln in self.traceback.strip().splitlines()[-8:])
        with np.printoptions(precision=6, threshold=48, edgeitems=3, linewidth=110):
            for name, x in self.case.arrays().items():
                # Size-1 axes squeezed away so that a shrunk example reads as a small matrix.
                text = np.array2string(np.squeeze(np.asarray(x)), prefix="    ")
                lines.append(f"  {name} {tuple(np.shape(x))} (squeezed) =\n    {text}")
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

    def summary(self) -> str:
        head = (
            f"{self.name}: {'PASSED' if self.passed else 'FAILED'} — variant={self.variant} "
            f"array={self.array} dtype={self.dtype} device={self.device}"
            + ("" if self.chunk_size is None else f" chunk_size={self.chunk_size}")
            + f"; {self.examples} "
            f"examples ({self.rejected} outside the precision's envelope), seed={self.seed}, "
            f"{self.elapsed_s:.1f} s; worst error/budget on passing examples "
            f"{self.worst_ratio:.3g}"
        )
        if self.passed:
            return head
        parts = [head, f"{len(self.failures)} failure(s), shrunk by Hypothesis:"]
        parts.extend(f.describe() for f in self.failures)
        return "\n".join(parts)

    def __bool__(self) -> bool:
        return self.passed


class _CheckFailed(AssertionError):
    def __init__(self, failure: Failure) -> None:
        self.failure = failure
        super().__init__(failure.message)


def _finite(arrays: Any) -> bool:
    return all(np.all(np.isfinite(a)) for a in arrays)


def _split_result(result: Any) -> tuple[Any, tuple[Any, Any, Any] | None]:
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], (tuple, list)):
        state = tuple(result[1])
        if len(state) != 3:
            raise TypeError(f"the returned state must be (S, A, z), got {len(state)} entries")
        return result[0], state  # type: ignore[return-value]
    return result, None


def _check_array(x: Any, array: str, name: str) -> str | None:
    if array == "torch" and not is_torch(x):
        return f"{name} is a {type(x).__name__}, expected a torch.Tensor (inputs were torch)"
    if array == "numpy" and not isinstance(x, np.ndarray):
        return f"{name} is a {type(x).__name__}, expected a numpy.ndarray (inputs were NumPy)"
    return None


def same_precision_runs(
    inputs: Sequence[np.ndarray],
    initial_state: tuple[np.ndarray, ...] | None,
    *,
    config: VLAConfig,
    variant: str,
    dtype: str,
    seed: int = 0,
    samples: int = BASELINE_SAMPLES,
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
            recurrence(*xs, config=config, variant=variant, initial_state=state, dtype=base_dtype)
        )
    return runs


def _history_scales(
    history: Any, initial: tuple[np.ndarray, ...] | None, q: np.ndarray, config: VLAConfig
) -> dict[str, np.ndarray]:
    """Per (b, h): the magnitude of the terms that make each quantity (the floor's scale).

    ``S, A, z``: the largest entry over the run, the initial state included.  ``o``: the
    a-priori scale of the read-out ``o_t = S_t q_t / d_t`` — the dot product's terms,
    ``max_t (|S_t| |q_t|) / d_t`` — since its rounding error is bounded by ``|S_t| |q_t|``, not
    by ``|o_t|`` (large values and small read-outs cancel).
    """
    scales = {
        "S": np.max(np.abs(history.S), axis=(1, 3, 4)),
        "A": np.max(np.abs(history.A), axis=(1, 3, 4)),
        "z": np.max(np.abs(history.z), axis=(1, 3)),
    }
    if initial is not None:
        for name, x, axes in zip("SAz", initial, ((2, 3), (2, 3), (2,)), strict=True):
            scales[name] = np.maximum(scales[name], np.max(np.abs(x), axis=axes))
    else:  # the default start: S_0 = 0, z_0 = 0, A_0 = I/lambda0 (the first downdate cancels it)
        scales["A"] = np.maximum(scales["A"], 1.0 / config.lambda0)
    terms = np.einsum("bthij,bthj->bthi", np.abs(history.S), np.abs(q))  # [B, T, H, dv]
    if config.normalize_output:
        den = np.maximum(np.einsum("bthj,bthj->bth", history.z, q), config.out_eps)
        terms = terms / den[..., None]
    scales["o"] = np.max(terms, axis=(1, 3))
    return scales


def _carry_cut(split: int, T: int, period: int | None) -> int | None:
    """Where to cut for the state-carry check, or None if no cut is valid.

    The state ``(S, A, z)`` of spec §4 does not carry the nudge clock: the nudge fires at global
    steps ``t % nudge_period == 0``, so a suffix started from a carried state only continues the
    whole sequence when the cut is a multiple of ``nudge_period`` or no nudge falls after it.
    """
    if T < 2:
        return None
    if period is None or T < period:
        return split
    cut = period * max(1, round(split / period))
    while cut >= T:
        cut -= period
    return cut if cut >= 1 else None


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
    when the oracle itself is not finite in ``fn``'s precision (the case lies outside that
    precision's envelope and says nothing about ``fn``)."""

    def impl(x: np.ndarray) -> Any:
        return from_numpy(x, array, dtype, device)

    given_inputs = [impl(x) for x in (case.q, case.k, case.v, case.u)]
    given_state = None if case.initial_state is None else tuple(impl(x) for x in case.initial_state)
    # The exact values fn sees, in float64: the reference is computed from these.
    seen = [to_numpy(x) for x in given_inputs]
    seen_state = None if given_state is None else tuple(to_numpy(x) for x in given_state)
    ref = recurrence(
        *seen, config=config, variant=variant, initial_state=seen_state, return_states=True
    )
    base_runs = same_precision_runs(
        seen, seen_state, config=config, variant=variant, dtype=dtype, seed=case.seed
    )
    if not _finite([ref.o, *ref.state, *(x for r in base_runs for x in (r.o, *r.state))]):
        return None
    B, T, H, dk, dv = case.shapes

    def call(inputs: list[Any], state: Any) -> tuple[Any, Any]:
        return _split_result(fn(*inputs, config=config, initial_state=state))

    try:
        o, state = call(given_inputs, given_state)
    except Exception as exc:  # a crashing fn is a failure, never an error of validate
        return Failure(
            "crash",
            f"fn raised {type(exc).__name__}: {exc}",
            case,
            traceback=traceback.format_exc(),
        ), np.inf

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
    scales = _history_scales(ref.history, seen_state, seen[0], config)
    # The floor's summation length (error_model.py): the recurrence's longest inner product has
    # dk terms; a chunked form also sums over up to C tokens of its chunk (spec §5).
    terms = dk + (chunk_size or 0)
    comparisons = []
    for name, x in outputs.items():
        problem = _check_array(x, array, name)
        if problem:
            return Failure("type", problem, case), np.inf
        got = to_numpy(x)
        if got.shape != expected_shapes[name]:
            return Failure(
                "shape", f"{name} has shape {got.shape}, expected {expected_shapes[name]}", case
            ), np.inf
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
            )
        )
    bad = [c for c in comparisons if not c.passed]
    if bad:
        kind = "nonfinite" if any(not np.all(np.isfinite(c.error)) for c in bad) else "mismatch"
        which = ", ".join(c.name for c in bad)
        return Failure(kind, f"{which} outside the error budget", case, comparisons), np.inf
    worst = max(c.ratio for c in comparisons)

    cut = _carry_cut(case.split, T, config.nudge_period)
    if check_carry and state is not None and cut is not None:
        first = [x[:, :cut] for x in given_inputs]
        second = [x[:, cut:] for x in given_inputs]
        try:
            o1, state1 = call(first, given_state)
            if state1 is None:
                raise TypeError("fn returned a state for the whole sequence but not for a prefix")
            if any(x is None for x in state1):
                # fn does not keep some entry (e.g. A for a delta-rule kernel): carry the oracle's.
                prefix = recurrence(
                    *[x[:, :cut] for x in seen],
                    config=config,
                    variant=variant,
                    initial_state=seen_state,
                )
                state1 = tuple(
                    impl(p) if s is None else s for s, p in zip(state1, prefix.state, strict=True)
                )
            o2, _ = call(second, tuple(state1))
        except Exception as exc:
            return Failure(
                "crash",
                f"fn raised {type(exc).__name__} during the state-carry check: {exc}",
                case,
                traceback=traceback.format_exc(),
            ), np.inf
        joined = np.concatenate([to_numpy(o1), to_numpy(o2)], axis=1)
        if joined.shape != ref.o.shape:
            return Failure(
                "shape", f"carried outputs have shape {joined.shape}, expected {ref.o.shape}", case
            ), np.inf
        carry = compare(
            "o", joined, ref.o, bases["o"], dtype, factor=factor, scale=scales["o"], terms=terms
        )
        if not carry.passed:
            return Failure(
                "carry",
                f"the sequence cut after token {cut}, continued from the state fn returned, "
                "differs from the whole sequence",
                case,
                [carry],
            ), np.inf
        worst = max(worst, carry.ratio)
    return None, worst


def _check_usage(array: str, dtype: str, device: str) -> None:
    if array not in ARRAY_LIBRARIES:
        raise VLAInputError("array", f"expected one of {ARRAY_LIBRARIES}, got {array!r}")
    if dtype not in array_dtypes(array):
        raise DTypeError("dtype", f"array={array!r} supports {array_dtypes(array)}, got {dtype!r}")
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


def validate(
    fn: Implementation,
    *,
    config: VLAConfig | None = None,
    variant: str = "vla",
    array: str = "numpy",
    dtype: str = "float64",
    device: str = "cpu",
    max_examples: int = 100,
    seed: int | None = None,
    factor: float = DEFAULT_FACTOR,
    bounds: ShapeBounds | None = None,
    check_carry: bool = True,
    chunk_size: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ValidationReport:
    """Check ``fn`` (spec §4) against the float64 oracle on Hypothesis-generated inputs.

    Parameters
    ----------
    fn : callable ``fn(q, k, v, u, *, config, initial_state=None) -> o | (o, (S, A, z))``.
        A registry :class:`~vla_verify.backends.Backend` is bound to ``variant`` automatically.
    config : the configuration ``fn`` implements (default: the paper preset).
    variant : which recurrence ``fn`` implements (``vla``, ``rls``, ``delta``, ``linear``).
    array, dtype, device : what ``fn`` is fed (``numpy`` or ``torch``; any float dtype the
        library holds; a torch device string).
    max_examples : Hypothesis examples to try (shrinking comes on top).
    seed : Hypothesis seed; ``None`` draws one and records it in the report.
    factor : the spec §4 factor over the same-precision oracle's error (default 2).
    bounds : largest sizes to draw (:class:`~vla_verify.properties.strategies.ShapeBounds`).
    check_carry : also check state carry when ``fn`` returns a state.
    chunk_size : for a chunked implementation (spec §5), its chunk length ``C``: its inner
        products run over up to ``dk + C`` terms instead of the recurrence's ``dk``, and the
        float32/float64 floor of :mod:`vla_verify.error_model` grows accordingly (the factor
        does not change).  A bound registry backend with a ``chunk_size`` option declares it
        itself.
    progress : called as ``progress(examples_done, max_examples)``.

    Returns
    -------
    ValidationReport
        ``.passed``, ``.failures`` (each with the shrunk input, expected vs got, error and
        budget) and ``.summary()``.
    """
    config = VLAConfig() if config is None else config
    check_variant(variant)
    _check_usage(array, dtype, device)
    if max_examples < 1:
        raise VLAInputError("max_examples", f"expected a positive integer, got {max_examples!r}")
    support: Callable[[Shapes], str | None] | None = None
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

        def support(shapes: Shapes) -> str | None:
            return backend.check_support(config, shapes, dtype, device)

        if chunk_size is None:
            chunk_size = backend.options.get("chunk_size")
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
        raise VLAInputError("chunk_size", f"expected a positive integer, got {chunk_size!r}")

    if seed is None:
        seed = int.from_bytes(os.urandom(4), "little")
    counters = {"examples": 0, "rejected": 0, "worst": 0.0}
    strategy = cases(config, bounds)

    @hypothesis_seed(seed)
    @settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        derandomize=False,
        report_multiple_bugs=False,
        print_blob=False,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def check(case: Case) -> None:
        if support is not None and support(Shapes(*case.shapes)) is not None:
            reject()
        outcome = evaluate_case(
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
        )
        counters["examples"] += 1
        if progress is not None:
            progress(min(counters["examples"], max_examples), max_examples)
        if outcome is None:
            counters["rejected"] += 1
            reject()
        failure, ratio = outcome
        if failure is not None:
            raise _CheckFailed(failure)
        counters["worst"] = max(counters["worst"], ratio)

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
    )
