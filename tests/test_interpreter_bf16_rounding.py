"""The interpreter's float to bf16 conversions rounded to nearest
(:func:`vla_verify.runtime.round_interpreter_bf16_to_nearest`):
:func:`~vla_verify.runtime.bf16_bits` gives PyTorch's bf16 (round to nearest, ties to even) bit
for bit on float32 values, edge cases included, and rounds a float64 once; a kernel's store into
a bf16 tensor and its ``.to`` give the same bits under the interpreter; the interpreter's own
conversion, which truncates, is told apart by the same comparisons."""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from vla_verify.runtime import bf16_bits  # noqa: E402


def _torch_bits(x: np.ndarray) -> np.ndarray:
    return torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def _edge_cases() -> np.ndarray:
    one = np.float32(1.0)
    return np.array(
        [
            0.0, -0.0, np.inf, -np.inf,
            one + 2.0**-8,  # a tie between 1 and 1 + 2^-7: to the even one, 1
            one + 3 * 2.0**-8,  # a tie to 1 + 2^-6 (even)
            one + 2.0**-8 + 2.0**-20,  # just above the tie: up
            2.0 - 2.0**-9,  # rounds up into the next binade (a carry into the exponent)
            3.3895313892515355e38,  # the largest finite bf16
            3.3961e38,  # past it by more than half a unit: inf
            1e-40, -1e-45, 2.0**-133, 3 * 2.0**-135,  # float32 and bf16 subnormals
        ],
        dtype=np.float32,
    )  # fmt: skip


def test_bf16_bits_is_pytorchs_rounding_of_float32() -> None:
    rng = np.random.default_rng(0)
    scale = np.exp(rng.uniform(-90.0, 88.0, 200_000))
    x = np.concatenate([rng.standard_normal(200_000) * scale, _edge_cases()]).astype(np.float32)
    np.testing.assert_array_equal(bf16_bits(x.astype(np.float64)), _torch_bits(x))
    nan = bf16_bits(np.array([np.nan]))
    assert np.isnan(torch.from_numpy(nan.view(np.int16)).view(torch.bfloat16).float().item())


def test_truncation_differs_from_the_rounding() -> None:
    # The comparison above rejects a conversion that drops the low bits, as the interpreter's.
    rng = np.random.default_rng(1)
    x = rng.standard_normal(10_000).astype(np.float32)
    truncated = (x.view(np.uint32) >> 16).astype(np.uint16)
    assert np.mean(truncated != _torch_bits(x)) > 0.4
    assert np.mean(truncated != bf16_bits(x.astype(np.float64))) > 0.4


def test_a_float64_is_rounded_once() -> None:
    # 1 + 2^-8 + 2^-40 is above the tie between 1 and 1 + 2^-7: one rounding gives 1 + 2^-7;
    # through float32 it first becomes the tie, which then rounds to the even 1.
    x = np.array([1.0 + 2.0**-8 + 2.0**-40])
    assert bf16_bits(x)[0] == 0x3F81
    assert _torch_bits(x.astype(np.float32))[0] == 0x3F80


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="checks the CPU interpreter's conversions"
)
def test_the_interpreters_conversions_round_to_nearest() -> None:
    pytest.importorskip("triton")
    import triton
    import triton.language as tl
    from triton.runtime import interpreter

    from vla_verify.runtime import round_interpreter_bf16_to_nearest

    @triton.jit
    def convert(x_ptr, stored_ptr, cast_ptr, wide_ptr, N: tl.constexpr):
        o = tl.arange(0, N)
        x = tl.load(x_ptr + o)
        tl.store(stored_ptr + o, x)
        tl.store(cast_ptr + o, x.to(tl.bfloat16))
        tl.store(wide_ptr + o, x.to(tl.float64).to(tl.bfloat16))

    def run() -> list[np.ndarray]:
        outs = [torch.empty(n, dtype=torch.bfloat16) for _ in range(3)]
        convert[(1,)](x, *outs, N=n)
        return [o.view(torch.int16).numpy().view(np.uint16) for o in outs]

    assert round_interpreter_bf16_to_nearest()
    n = 4096
    x = torch.randn(n) * 3
    expected = _torch_bits(x.numpy())
    for got in run():
        np.testing.assert_array_equal(got, expected)
    builder = interpreter.InterpreterBuilder
    rounding = builder.cast_impl
    builder.cast_impl = builder._truncating_cast
    try:
        stored, cast, _ = run()
    finally:
        builder.cast_impl = rounding
    assert np.mean(stored != expected) > 0.4
    assert np.mean(cast != expected) > 0.4
