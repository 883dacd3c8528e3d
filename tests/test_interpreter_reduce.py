"""The interpreter's reductions folded by slices
(:func:`vla_verify.runtime.fold_interpreter_reductions`) are bit-identical to the interpreter's
own element-by-element fold, on combine functions whose result depends on the order of the fold;
a fold in another order is caught by the same comparison; a combine function for scalars only
still runs."""

from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("torch")
triton = pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("checks the CPU interpreter's reduction", allow_module_level=True)

import torch  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

from vla_verify import runtime  # noqa: E402


@triton.jit
def _pair(a0, b0, a1, b1):
    # Order-sensitive in float32: a running sum and a damped one.
    return a0 + a1, 0.5 * b0 - b1


@triton.jit
def _single(a0, a1):
    return a0 * 0.75 + a1


@triton.jit
def _reduce_kernel(x_ptr, y_ptr, o1_ptr, o2_ptr, R: tl.constexpr, C: tl.constexpr,
                   N: tl.constexpr, AXIS: tl.constexpr, PAIR: tl.constexpr):  # fmt: skip
    r = tl.arange(0, R)
    c = tl.arange(0, C)
    x = tl.load(x_ptr + r[:, None] * C + c[None, :])
    y = tl.load(y_ptr + r[:, None] * C + c[None, :])
    o = tl.arange(0, N)  # the reduced tile's length: C along axis 0, R along 1
    if PAIR:
        s, t = tl.reduce((x, y), AXIS, _pair)
        tl.store(o1_ptr + o, s)
        tl.store(o2_ptr + o, t)
    else:
        # keep_dims, then the whole tile at once (axis None: the flattened tile) plus a 1-D
        # fold of a 1-D tensor.
        kept = tl.reduce(x, AXIS, _single, keep_dims=True)
        tl.store(o1_ptr + o, tl.reshape(kept, [N]))
        total = tl.reduce(y, None, _single) + tl.reduce(tl.reshape(x, [R * C]), 0, _single)
        tl.store(o2_ptr + o, tl.full([N], 0.0, tl.float32) + total)


def _run(axis: int, pair: bool, generic) -> tuple[np.ndarray, np.ndarray]:  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(axis + 2 * pair)
    R, C = 8, 16
    # Values across many binades, so that a different order rounds differently.
    x = torch.randn(R, C, generator=g) * 10.0 ** torch.randint(-6, 7, (R, C), generator=g)
    y = torch.randn(R, C, generator=g) * 10.0 ** torch.randint(-6, 7, (R, C), generator=g)
    n = C if axis == 0 else R
    o1, o2 = torch.empty(n), torch.empty(n)
    saved = interpreter.ReduceOps.generic_reduce
    interpreter.ReduceOps.generic_reduce = generic
    try:
        _reduce_kernel[(1,)](x, y, o1, o2, R=R, C=C, N=n, AXIS=axis, PAIR=pair)
    finally:
        interpreter.ReduceOps.generic_reduce = saved
    return o1.numpy(), o2.numpy()


def _slow():  # type: ignore[no-untyped-def]
    assert runtime.fold_interpreter_reductions()
    return interpreter.ReduceOps._element_fold


@pytest.mark.parametrize("pair", [True, False], ids=["pair", "single"])
@pytest.mark.parametrize("axis", [0, 1])
def test_fold_is_bit_identical_to_the_interpreters(axis: int, pair: bool) -> None:
    want = _run(axis, pair, _slow())
    got = _run(axis, pair, runtime._fold_reduce)
    for w, g in zip(want, got, strict=True):
        np.testing.assert_array_equal(g, w)


def test_a_fold_in_reverse_order_is_caught() -> None:
    """The comparison above can fail: the same fold with the elements taken last to first
    differs from the interpreter's."""

    def reversed_fold(self, input):  # type: ignore[no-untyped-def]
        flipped = tuple(
            self.to_tensor(np.ascontiguousarray(np.flip(x.handle.data, self.axis)), x.dtype)
            for x in input
        )
        return runtime._fold_reduce(self, flipped)

    want = _run(0, True, _slow())
    got = _run(0, True, reversed_fold)
    assert any(not np.array_equal(g, w) for w, g in zip(want, got, strict=True))


@triton.jit
def _scalar_only(a0, a1):
    # A Python ``if`` on the arguments: defined on scalars only.
    if a0 > a1:
        return a0
    return a1


@triton.jit
def _max_kernel(x_ptr, o_ptr, R: tl.constexpr, C: tl.constexpr):
    r = tl.arange(0, R)
    c = tl.arange(0, C)
    x = tl.load(x_ptr + r[:, None] * C + c[None, :])
    tl.store(o_ptr + c, tl.reduce(x, 0, _scalar_only))


def test_a_combine_function_for_scalars_only_takes_the_element_fold() -> None:
    runtime.fold_interpreter_reductions()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    o = torch.empty(8)
    _max_kernel[(1,)](x, o, R=4, C=8)
    torch.testing.assert_close(o, x.max(0).values, rtol=0, atol=0)
