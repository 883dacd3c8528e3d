"""How the command line sets up the process before it runs anything: the Triton interpreter on a
machine without a GPU (with its reductions folded by slices and its bf16 conversions rounded as
the GPU rounds them), and Hypothesis draws that depend on the seed alone.

Both must happen before the first kernel import or the first Hypothesis draw, and the same way for
every subcommand, so that ``run``, ``check``, ``backends`` and ``claims`` see the same backends and
the same seed gives the same figures.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from collections.abc import Iterator
from typing import Any

__all__ = [
    "cuda_available",
    "fold_interpreter_reductions",
    "round_interpreter_bf16_to_nearest",
    "seed_only_draws",
    "use_triton_interpreter_without_gpu",
]


def cuda_available() -> bool:
    """Whether PyTorch is installed and sees a CUDA GPU."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _triton_installed() -> bool:
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):
        return False


def use_triton_interpreter_without_gpu() -> bool:
    """Set ``TRITON_INTERPRET=1`` when Triton is installed, there is no CUDA GPU and the user has
    not chosen, so that the Triton kernels run on the CPU through Triton's interpreter.  Must run
    before triton is first imported (it reads the variable at import); returns whether it set
    it."""
    if "TRITON_INTERPRET" in os.environ or "triton" in sys.modules or not _triton_installed():
        return False
    if cuda_available():
        return False
    os.environ["TRITON_INTERPRET"] = "1"
    return True


def _running_interpreter() -> Any:
    """Triton's interpreter module when ``TRITON_INTERPRET=1`` and it imports, else ``None``."""
    if os.environ.get("TRITON_INTERPRET") != "1" or not _triton_installed():
        return None
    try:
        from triton.runtime import interpreter
    except Exception:
        return None
    return interpreter


def fold_interpreter_reductions() -> bool:
    """Under Triton's interpreter (``TRITON_INTERPRET=1``), fold every reduction with a user
    combine function by slices instead of element by element; returns whether it is installed.

    The interpreter calls such a combine function once per element, on scalars
    (``ReduceOps.generic_reduce``): a paired sum over a ``[128, 128]`` tile, as the recurrent
    kernels make per token, is 16384 Python calls.  :func:`_fold_reduce` folds the same elements
    in the same order, ``acc = x_0``, ``acc = f(acc, x_i)`` for ``i = 1, 2, …`` along the axis,
    on whole slices: ``n − 1`` calls on tensors, and each output element sees the same float
    operations in the same order, so the results are bit-identical
    (``tests/test_interpreter_reduce.py``).  A combine function that cannot run on tensors (a
    Python ``if`` on its arguments, which the interpreter would take as true for a whole
    slice) runs the interpreter's own fold.  Uses the interpreter's private class; where it is
    absent, nothing changes.  Must run after the variable is set."""
    interpreter = _running_interpreter()
    if interpreter is None:
        return False
    ops = getattr(interpreter, "ReduceOps", None)
    if ops is None or not all(hasattr(ops, n) for n in ("generic_reduce", "unravel", "to_tensor")):
        return False
    if getattr(ops, "_element_fold", None) is None:
        ops._element_fold = ops.generic_reduce
        ops.generic_reduce = _fold_reduce
    return True


def _fold_reduce(self: Any, input: tuple[Any, ...]) -> list[Any]:
    """``ReduceOps.generic_reduce`` by slices (:func:`fold_interpreter_reductions`); the same
    arguments and results."""
    import triton.language as tl

    # The interpreter makes any tensor of more than one element true; inside the fold a
    # combine function that branches on its arguments (defined on scalars only) must not
    # branch on a slice, so such a truth test raises and the element fold runs instead.
    tensor = tl.core.tensor
    truth = tensor.__dict__.get("__bool__")

    def one_element_truth(t: Any) -> bool:
        if t.handle.data.size != 1:
            raise TypeError("a combine function branched on a slice")
        return bool(t.handle.data)

    tensor.__bool__ = one_element_truth  # type: ignore[method-assign]
    try:
        return _fold_by_slices(self, input)
    except Exception:  # a combine function for scalars only: the interpreter's own fold
        pass
    finally:
        if truth is None:
            del tensor.__bool__
        else:
            tensor.__bool__ = truth  # type: ignore[method-assign]
    return list(type(self)._element_fold(self, input))


def _fold_by_slices(self: Any, input: tuple[Any, ...]) -> list[Any]:
    """The left fold along the reduced axis, one combine call per slice; then the output packed
    as ``generic_reduce`` packs it (``keep_dims``, a scalar for ``axis=None``)."""
    import numpy as np
    import triton.language as tl

    original_axis = self.axis
    input, axis = self.unravel(input, self.axis)
    data = [arg.handle.data for arg in input]
    shape = data[0].shape
    out_shape = shape[:axis] + shape[axis + 1 :]
    acc = [np.take(d, 0, axis=axis).astype(d.dtype) for d in data]
    for i in range(1, shape[axis]):
        left = tuple(self.to_tensor(a, x.dtype) for a, x in zip(acc, input, strict=True))
        right = tuple(
            self.to_tensor(np.take(d, i, axis=axis), x.dtype)
            for d, x in zip(data, input, strict=True)
        )
        ret = self.combine_fn.fn(*left, *right)
        ret = ret if isinstance(ret, tuple) else (ret,)
        acc = [
            np.asarray(r.handle.data if isinstance(r, tl.core.tensor) else r)
            .reshape(out_shape)
            .astype(d.dtype)
            for r, d in zip(ret, data, strict=True)
        ]
    results = []
    for a, x in zip(acc, input, strict=True):
        a = np.asarray(a).reshape(out_shape)
        if self.keep_dims:
            if original_axis is not None:
                a = np.expand_dims(a, axis)
            else:
                for _ in range(len(shape)):
                    a = np.expand_dims(a, 0)
        elif original_axis is None:
            a = a.item()
        results.append(self.to_tensor(a, x.dtype))
    return results


def round_interpreter_bf16_to_nearest() -> bool:
    """Under Triton's interpreter (``TRITON_INTERPRET=1``), round every conversion of a float
    to bf16 to nearest, ties to even, as the GPU's ``cvt.rn`` does; returns whether it is
    installed.

    The interpreter converts float32 to bf16 by dropping the low 16 bits
    (``InterpreterBuilder.cast_impl`` passes no rounding mode, for ``.to(tl.bfloat16)`` and for
    a store into a bf16 tensor alike): an error of up to one unit in the last place instead of
    half of one, always towards zero, so a bf16 kernel checked on the CPU seemed less accurate
    than it is on the GPU.  (A float64 source it converted as an integer.)  Here the value is
    rounded once from its exact value (:func:`bf16_bits`); other conversions run as before.
    Uses the interpreter's private class; where it is absent, nothing changes.  Must run after
    the variable is set."""
    interpreter = _running_interpreter()
    if interpreter is None:
        return False
    builder = getattr(interpreter, "InterpreterBuilder", None)
    if (
        builder is None
        or not hasattr(builder, "cast_impl")
        or not hasattr(interpreter, "TensorHandle")
    ):
        return False
    if getattr(builder, "_truncating_cast", None) is None:
        builder._truncating_cast = builder.cast_impl
        builder.cast_impl = _cast_rounding_bf16
    return True


def _cast_rounding_bf16(self: Any, src: Any, dst_type: Any) -> Any:
    """``InterpreterBuilder.cast_impl`` with float to bf16 rounded to nearest
    (:func:`round_interpreter_bf16_to_nearest`); the same arguments and result."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    source = src.dtype.scalar
    target = dst_type.scalar
    if target == tl.bfloat16 and source in (tl.float32, tl.float64):
        bits = bf16_bits(np.asarray(src.data, dtype=np.float64))
        return interpreter.TensorHandle(bits, target)
    return type(self)._truncating_cast(self, src, dst_type)


def bf16_bits(x: Any) -> Any:
    """The bf16 nearest to each element of the float64 array ``x`` (ties to even; past the
    largest finite bf16 by half a unit or more, ±inf; NaN to the quiet NaN), as the uint16 bit
    patterns of the same shape.

    ``x = m·2^e`` with ``1/2 ≤ |m| < 1`` (``numpy.frexp``) has bf16 neighbours ``2^(e−8)``
    apart (8 significant bits), or ``2^−133`` apart below the normal range; ``x`` divided by
    that spacing is exact in float64, :func:`numpy.rint` rounds it to nearest even, and the
    product back is a bf16 value, exact in float32, whose high 16 bits are the result."""
    import numpy as np

    x = np.asarray(x, dtype=np.float64)
    finite = np.isfinite(x)
    safe = np.where(finite, x, 0.0)
    _, e = np.frexp(safe)
    spacing = np.ldexp(1.0, np.maximum(e - 8, -133))
    rounded = np.rint(safe / spacing) * spacing
    rounded = np.where(np.abs(rounded) >= 2.0**128, np.copysign(np.inf, x), rounded)
    rounded = np.where(finite, rounded, x)
    with np.errstate(invalid="ignore", over="ignore"):
        bits = (rounded.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), bits).astype(np.uint16)


@contextlib.contextmanager
def seed_only_draws() -> Iterator[bool]:
    """Within the block, Hypothesis' draws depend on the seed alone, not on which modules are
    imported; yields whether it could arrange that.

    Hypothesis (6.13x and later) mixes into its draws constants collected from the source of
    every local module in ``sys.modules``, cached at the first draw of each kind.  ``vla-verify
    run`` imports the conformance machinery and the backends before the claims' searches,
    ``claims`` does not, so the same seed drew different examples (C3's search differed from the
    first drawn ``seed`` on).  Inside the block the collection is off and the cache empty; both
    are restored on exit.  Uses a private Hypothesis hook; where it is absent, nothing changes.
    """
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:  # pragma: no cover - hypothesis is a dependency
        yield False
        return
    hook = getattr(providers, "_get_local_constants", None)
    pool = getattr(providers, "_local_constants", None)
    cache = getattr(providers, "CONSTANTS_CACHE", None)
    if hook is None or pool is None or cache is None:
        yield False
        return
    empty = type(pool)()
    # A fresh cache: entries drawn before the block were computed with the constants.
    providers.CONSTANTS_CACHE = type(cache)(getattr(cache, "max_size", 1024))
    providers._get_local_constants = lambda: empty
    try:
        yield True
    finally:
        providers._get_local_constants = hook
        providers.CONSTANTS_CACHE = cache
