"""Conversions between the array libraries of spec §4 (NumPy and PyTorch), imported lazily.

Only data movement lives here (no arithmetic of the recurrence), so the oracle and the kernels
may both use it without sharing a numerical helper.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import DeviceError, DTypeError
from .spec import FLOAT_DTYPES

__all__ = ["ARRAY_LIBRARIES", "array_dtypes", "from_numpy", "is_torch", "to_numpy"]

ARRAY_LIBRARIES = ("numpy", "torch")


def is_torch(x: Any) -> bool:
    """Whether ``x`` is a ``torch.Tensor`` (without importing torch)."""
    return type(x).__module__.startswith("torch") and hasattr(x, "detach")


def to_numpy(x: Any) -> np.ndarray:
    """Any NumPy array or torch tensor (any device, any float dtype) as a float64 NumPy array."""
    if is_torch(x):
        return x.detach().to("cpu").double().numpy()
    return np.asarray(x, dtype=np.float64)


def array_dtypes(array: str) -> tuple[str, ...]:
    """The float dtypes an array library can hold."""
    if array == "numpy":
        return ("float64", "float32", "float16")  # NumPy has no bfloat16
    if array == "torch":
        return FLOAT_DTYPES
    raise DTypeError("array", f"expected one of {ARRAY_LIBRARIES}, got {array!r}")


def from_numpy(x: np.ndarray, array: str, dtype: str, device: str = "cpu") -> Any:
    """A float64 NumPy array as an array of ``array`` library, ``dtype`` and ``device``."""
    if dtype not in array_dtypes(array):
        raise DTypeError(
            "dtype", f"array library {array!r} supports {array_dtypes(array)}, got {dtype!r}"
        )
    if array == "numpy":
        if device != "cpu":
            raise DeviceError("device", f"NumPy arrays live on 'cpu', got {device!r}")
        return np.asarray(x, dtype=getattr(np, dtype))
    import torch

    return torch.tensor(np.asarray(x, dtype=np.float64), dtype=getattr(torch, dtype), device=device)
