"""Backends: one module per implementation, plus the registry (:mod:`.registry`).

========================  ======================================================  ============
name                      what                                                    needs
========================  ======================================================  ============
``numpy``                 the float64 oracle, spec §2.3–§2.4 token by token      numpy
``mpmath``                the same recurrence at 50 (configurable) digits         mpmath
``torch``                 PyTorch sequential reference, differentiable            torch
``torch_chunked``         PyTorch exact chunked form of spec §5                   torch
``triton_fused``          Triton fused recurrent kernel, forward and backward     torch, triton
``triton_chunked``        Triton chunked kernel                                   torch, triton
========================  ======================================================  ============
"""

from .registry import (
    ENV_VAR,
    Backend,
    BackendStatus,
    Capabilities,
    available,
    get,
    names,
    register,
    selected,
)

__all__ = [
    "ENV_VAR",
    "Backend",
    "BackendStatus",
    "Capabilities",
    "available",
    "get",
    "names",
    "register",
    "selected",
]

_TORCH_HINT = "pip install 'vla-verify[torch]'"
_TRITON_HINT = "pip install 'vla-verify[triton]'"

register(
    "numpy",
    "vla_verify.backends.numpy_oracle",
    "NumpyOracleBackend",
    "float64 NumPy oracle (spec §2.3-§2.4), the reference",
    requires=("numpy",),
)
register(
    "mpmath",
    "vla_verify.backends.mpmath_backend",
    "MpmathBackend",
    "mpmath high-precision recurrence (small shapes)",
    requires=("mpmath",),
)
register(
    "torch",
    "vla_verify.backends.torch_sequential",
    "TorchSequentialBackend",
    "PyTorch sequential reference, differentiable",
    requires=("torch",),
    install_hint=_TORCH_HINT,
)
register(
    "torch_chunked",
    "vla_verify.backends.torch_chunked",
    "TorchChunkedBackend",
    "PyTorch exact chunked form (spec §5), differentiable",
    requires=("torch",),
    install_hint=_TORCH_HINT,
)
register(
    "triton_fused",
    "vla_verify.backends.triton_fused",
    "TritonFusedBackend",
    "Triton fused recurrent kernel, forward and backward",
    requires=("torch", "triton"),
    install_hint=_TRITON_HINT,
)
register(
    "triton_chunked",
    "vla_verify.backends.triton_chunked",
    "TritonChunkedBackend",
    "Triton chunked kernel (spec §5)",
    requires=("torch", "triton"),
    install_hint=_TRITON_HINT,
)
register(
    "fla",
    "vla_verify.adapters.fla",
    "FlaBackend",
    "external: flash-linear-attention kernels (delta rule; IPLR/DPLR as VLA's state update)",
    requires=("torch", "triton", "fla"),
    install_hint="pip install --no-deps fla-core==0.6.0 && pip install einops",
)
