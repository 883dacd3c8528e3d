"""Meta-tests of :mod:`vla_verify.gradient_check`: a correct backward in another algorithm passes,
planted wrong gradients fail on the input they touch, the perturbed copies are one ulp away,
and bad arguments are refused by name."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from vla_verify import VLAConfig, backends  # noqa: E402
from vla_verify.errors import DTypeError, ShapeError, VLAInputError  # noqa: E402
from vla_verify.gradient_check import GRADIENT_NAMES, check_gradients, one_ulp_copies  # noqa: E402

CONFIG = VLAConfig(nudge_period=4)


def _example(seed: int = 3, B: int = 1, T: int = 11, H: int = 2, dk: int = 5, dv: int = 4):
    rng = np.random.default_rng(seed)
    q = np.abs(rng.standard_normal((B, T, H, dk))) + 0.1
    k = rng.standard_normal((B, T, H, dk))
    v = rng.standard_normal((B, T, H, dv))
    u = rng.standard_normal((B, T, H, dk)) / np.sqrt(dk)
    G = rng.standard_normal((B, H, dk, dk))
    A0 = np.linalg.inv(0.1 * np.eye(dk) + G @ np.swapaxes(G, -1, -2))
    A0 = 0.5 * (A0 + np.swapaxes(A0, -1, -2))
    S0 = rng.standard_normal((B, H, dv, dk))
    z0 = 3.0 * np.abs(rng.standard_normal((B, H, dk)))
    arrays = [q, k, v, u, S0, A0, z0]
    cot = [rng.standard_normal(x.shape) for x in (v, S0, A0, z0)]
    return arrays, cot


class _ScaledGradient(torch.autograd.Function):
    """Identity forward; the backward scales the incoming gradient (a planted slip)."""

    @staticmethod
    def forward(ctx: Any, x: Any, factor: float) -> Any:  # type: ignore[override]
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, g: Any) -> Any:  # type: ignore[override]
        return g * ctx.factor, None


def _planted(index: int, factor: float):  # type: ignore[no-untyped-def]
    """The torch backend with the gradient of input ``index`` scaled by ``factor``."""
    ref = backends.get("torch")

    def fn(q, k, v, u, *, config, initial_state):  # type: ignore[no-untyped-def]
        xs = [q, k, v, u, *initial_state]
        xs[index] = _ScaledGradient.apply(xs[index], factor)
        return ref(*xs[:4], config=config, initial_state=tuple(xs[4:]))

    return fn


def test_a_correct_backward_in_another_algorithm_passes() -> None:
    """torch_chunked's autograd (the chunked forms of spec §5) against the sequential backend's,
    in float32 and float64."""
    ref = backends.get("torch")
    chunked = backends.get("torch_chunked")
    arrays, cot = _example()
    for dtype in ("float32", "float64"):
        checks = check_gradients(chunked, ref, arrays, cot, config=CONFIG, dtype=dtype, terms=9)
        assert list(checks) == list(GRADIENT_NAMES)
        assert all(c.passed for c in checks.values()), {n: c.ratio for n, c in checks.items()}


@pytest.mark.parametrize("index", [3, 5], ids=["u", "A0"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_slightly_wrong_gradient_fails_on_its_input(index: int, dtype: str) -> None:
    """A gradient 1e-3 off (relative) fails the input it belongs to and no other: far below any
    tolerance picked by eye, far above float32 rounding."""
    ref = backends.get("torch")
    arrays, cot = _example()
    checks = check_gradients(
        _planted(index, 1.0 + 1e-3), ref, arrays, cot, config=CONFIG, dtype=dtype
    )
    failed = [n for n, c in checks.items() if not c.passed]
    assert failed == [GRADIENT_NAMES[index]]


def test_one_ulp_copies_are_one_ulp_away() -> None:
    x = np.random.default_rng(0).standard_normal((3, 7))
    received, *moved = one_ulp_copies([x], "float32", 3, seed=1)
    assert np.array_equal(received[0], x.astype(np.float32).astype(np.float64))
    for (m,) in moved:
        steps = np.abs(m - received[0]) / np.spacing(np.abs(received[0]).astype(np.float32))
        # one ulp of float32 away, up or down (at a power of two the ulp below is half)
        assert np.all((steps == 1.0) | (steps == 0.5))
        assert np.all(m.astype(np.float32).astype(np.float64) == m)


def test_bad_arguments_are_refused_by_name() -> None:
    ref = backends.get("torch")
    arrays, cot = _example()
    with pytest.raises(DTypeError, match="dtype"):
        check_gradients(ref, ref, arrays, cot, config=CONFIG, dtype="bfloat16")
    with pytest.raises(VLAInputError, match="copies"):
        one_ulp_copies(arrays, "float32", -1)
    with pytest.raises(ShapeError, match="arrays"):
        check_gradients(ref, ref, arrays[:4], cot, config=CONFIG)
    with pytest.raises(ShapeError, match="cotangents"):
        check_gradients(ref, ref, arrays, cot[:2], config=CONFIG)
