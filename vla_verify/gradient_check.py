"""Gradients of a differentiable implementation against a float64 reference, under the
budget of spec §4.

The quantity checked is the gradient of ``Σ ⟨c_y, y⟩`` over the outputs ``y = o, S, A, z``
(fixed random cotangents ``c``) in the seven inputs ``q, k, v, u, S_0, A_0, z_0``, each compared
slice by slice in the layout of the input it is the gradient of (``o``-like for ``q, k, v, u``).

``err_p`` is measured as spec §4 asks: the float32 error of one or more straightforward
implementations (``baselines``, by default the reference itself), each against the float64
reference *on its own inputs*, the largest over the inputs as received and over copies of them
moved by one unit in the last place.  One run can round luckily, most of all on short examples
and on small gradients such as ``u``'s, and a budget built on a lucky run fails a correct kernel
that merely rounds in another order.

Only PyTorch implementations are differentiated here (``torch.autograd.grad``); NumPy and SciPy
suffice to import the module.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .error_model import SliceComparison, compare
from .errors import DTypeError, ShapeError, VLAInputError
from .validation import BASELINE_SAMPLES

__all__ = [
    "GRADIENT_LAYOUTS",
    "GRADIENT_NAMES",
    "check_gradients",
    "gradients",
    "one_ulp_copies",
]

#: The inputs whose gradients are checked, in the order of the arrays.
GRADIENT_NAMES = ("q", "k", "v", "u", "S0", "A0", "z0")
#: The slice layout (:data:`vla_verify.error_model.REDUCE_AXES`) of each gradient.
GRADIENT_LAYOUTS = ("o", "o", "o", "o", "S", "A", "z")
#: Float dtypes a gradient may be taken in.
_DTYPES = ("float32", "float64")


def _torch_dtype(dtype: str) -> Any:
    import torch

    return {"float32": torch.float32, "float64": torch.float64}[dtype]


def gradients(
    fn: Callable[..., Any],
    arrays: Sequence[np.ndarray],
    cotangents: Sequence[np.ndarray],
    dtype: str,
    *,
    config: Any,
    device: str = "cpu",
    **kwargs: Any,
) -> list[np.ndarray]:
    """The gradients (float64 NumPy, one per input) of ``Σ ⟨c_y, y⟩`` over ``fn``'s outputs
    ``(o, (S, A, z))``, ``fn`` called on the seven ``arrays`` (``q, k, v, u`` ``[B, T, H, ·]``,
    then ``S_0, A_0, z_0``) as torch tensors of ``dtype`` on ``device``, with ``config`` and
    ``kwargs``; ``cotangents`` are the four ``c_y`` in the outputs' shapes."""
    import torch

    _check_arrays(arrays, cotangents)
    xs = [
        torch.tensor(a, dtype=_torch_dtype(dtype), device=device, requires_grad=True)
        for a in arrays
    ]
    o, (S, A, z) = fn(*xs[:4], config=config, initial_state=tuple(xs[4:]), **kwargs)
    loss = sum(
        (y.double() * torch.tensor(c, dtype=torch.float64, device=device)).sum()
        for y, c in zip((o, S, A, z), cotangents, strict=True)
    )
    return [g.detach().double().cpu().numpy() for g in torch.autograd.grad(loss, xs)]


def one_ulp_copies(
    arrays: Sequence[np.ndarray], dtype: str, copies: int, seed: int = 0
) -> list[list[np.ndarray]]:
    """``arrays`` rounded to ``dtype`` (as an implementation in ``dtype`` receives them),
    followed by ``copies`` copies of those, each element moved by one unit in the last place of
    ``dtype`` up or down at random; all as float64."""
    if dtype not in _DTYPES:
        raise DTypeError("dtype", f"expected one of {_DTYPES}, got {dtype!r}")
    if isinstance(copies, bool) or not isinstance(copies, int) or copies < 0:
        raise VLAInputError("copies", f"expected a non-negative int, got {copies!r}")
    np_dtype = np.dtype(dtype)
    received = [np.asarray(a, dtype=np.float64).astype(np_dtype) for a in arrays]
    rng = np.random.default_rng(seed)
    out = [[x.astype(np.float64) for x in received]]
    for _ in range(copies):
        moved = []
        for x in received:
            toward = np.where(rng.random(x.shape) < 0.5, np.inf, -np.inf).astype(np_dtype)
            moved.append(np.nextafter(x, toward).astype(np.float64))
        out.append(moved)
    return out


def check_gradients(
    fn: Callable[..., Any],
    reference: Callable[..., Any],
    arrays: Sequence[np.ndarray],
    cotangents: Sequence[np.ndarray],
    *,
    config: Any,
    dtype: str = "float32",
    device: str = "cpu",
    baselines: Sequence[Callable[..., Any]] | None = None,
    copies: int = BASELINE_SAMPLES - 1,
    terms: int = 1,
    seed: int = 0,
    **kwargs: Any,
) -> dict[str, SliceComparison]:
    """``fn``'s gradients in ``dtype`` against ``reference``'s in float64, on the values ``fn``
    receives, each under the spec §4 budget (:func:`vla_verify.error_model.compare`).

    ``err_p`` is the float32 error of each of ``baselines`` (default: ``reference``) against
    the float64 reference on its own inputs, the largest over the received inputs and
    ``copies`` copies moved by one ulp (:func:`one_ulp_copies`; by default as many runs as
    :func:`vla_verify.validate` takes for a forward).  For ``dtype="float64"`` the
    float32 error of ``fn`` itself is one more baseline (the error model rescales these to
    float64: a correct kernel errs like either, a wrong one is O(1) off in both precisions).
    ``terms`` is the floor's inner-product length (``dk``, or ``dk + C`` for a chunked kernel,
    spec §4).  ``kwargs`` go to every call.  Returns ``{name: comparison}`` in the order of
    :data:`GRADIENT_NAMES`."""
    if dtype not in _DTYPES:
        raise DTypeError("dtype", f"expected one of {_DTYPES}, got {dtype!r}")
    runs = [reference] if baselines is None else list(baselines)
    base_dtype = "float32"
    received = one_ulp_copies(arrays, dtype, 0)[0]
    exact = gradients(reference, received, cotangents, "float64", config=config, device=device,
                      **kwargs)  # fmt: skip
    got = gradients(fn, received, cotangents, dtype, config=config, device=device, **kwargs)
    # Each baseline run's error, carried onto the reference (compare measures |b − exact|):
    # b' = exact + (run − its own float64 result).
    shifted: list[list[np.ndarray]] = []
    for values in one_ulp_copies(received, base_dtype, copies, seed):
        own = gradients(reference, values, cotangents, "float64", config=config, device=device,
                        **kwargs)  # fmt: skip
        for run in runs:
            g = gradients(run, values, cotangents, base_dtype, config=config, device=device,
                          **kwargs)  # fmt: skip
            shifted.append([e + (a - r) for e, a, r in zip(exact, g, own, strict=True)])
    if dtype == "float64":
        values = one_ulp_copies(received, base_dtype, 0)[0]
        own = gradients(reference, values, cotangents, "float64", config=config, device=device,
                        **kwargs)  # fmt: skip
        g = gradients(fn, values, cotangents, base_dtype, config=config, device=device, **kwargs)
        shifted.append([e + (a - r) for e, a, r in zip(exact, g, own, strict=True)])
    return {
        name: compare(layout, g, e, [s[i] for s in shifted], dtype, terms=terms)
        for i, (name, layout, g, e) in enumerate(
            zip(GRADIENT_NAMES, GRADIENT_LAYOUTS, got, exact, strict=True)
        )
    }


def _check_arrays(arrays: Sequence[np.ndarray], cotangents: Sequence[np.ndarray]) -> None:
    if len(arrays) != len(GRADIENT_NAMES):
        raise ShapeError(
            "arrays", f"expected {len(GRADIENT_NAMES)} arrays {GRADIENT_NAMES}, got {len(arrays)}"
        )
    if len(cotangents) != 4:
        raise ShapeError("cotangents", f"expected 4 arrays (for o, S, A, z), got {len(cotangents)}")
