"""flash-linear-attention's kernels behind the conformance interface of spec §4.

flash-linear-attention (PyPI ``fla-core``, import name ``fla``; written against 0.6.0) is the
field's reference Triton library.  VLA's state update is its *generalized delta rule* (spec §5),
and the spec's ``delta`` variant is its DeltaNet with β = 1, so fla's kernels can be validated by
the oracle like any implementation of ours.  This module wraps them; it imports torch, triton and
fla only when an adapter is first called.

Adapters (module attributes, each a registry :class:`~vla_verify.backends.Backend` bound to one
fla kernel; ``vla-verify check vla_verify.adapters.fla:NAME`` takes any of them):

- ``fused_recurrent_delta`` — ``fused_recurrent_delta_rule``, variant ``delta``;
  float32, bfloat16, float16.
- ``chunk_delta`` — ``chunk_delta_rule``, ``delta``; bfloat16, float16 (fla asserts against
  float32).
- ``fused_recurrent_iplr_vla`` — ``fused_recurrent_iplr_delta_rule``, ``vla``; float32, bfloat16,
  float16.
- ``chunk_iplr_vla`` — ``chunk_iplr_delta_rule``, ``vla``; float32, bfloat16, float16.
- ``fused_recurrent_dplr_vla`` — ``fused_recurrent_dplr_delta_rule`` (``gk = 0``), ``vla``;
  float32, bfloat16, float16.
- ``chunk_dplr_vla`` — ``chunk_dplr_delta_rule`` (``gk = 0``), ``vla``; float32, bfloat16,
  float16.

float64 is refused by every adapter: fla's kernels accumulate the state in float32 (``b_h`` is
``tl.float32``), so a float64 request would be judged against a budget no float32 kernel meets.

Layouts (spec §1 against fla's, fla's docstrings).  Sequences are the same: ``[B, T, H, D]``,
sequence-first, no conversion.  States differ: our ``S`` is ``[B, H, dv, dk]`` (``S k ≈ v``);
fla's ``h`` is ``[N, H, K, V]`` with ``N = B`` (no varlen here), the transpose per head:
``h = Sᵀ``.  The only conversions are :func:`to_fla_state` and :func:`from_fla_state`.  fla
allocates its final state in float32 and reads an initial state of any float dtype into float32;
we hand it float32 (exact for every input dtype) and cast its final state back to the inputs'
dtype, as spec §4 carries states in the inputs' dtype.

The ``delta`` variant (spec §2.4): ``S_t = S_{t-1} + (v_t − S_{t-1} k̂_t) k̂_tᵀ``, read-out
``o_t = S_t q_t`` (``normalize_output=False``) or ``S_t q_t / max(z_tᵀ q_t, out_eps)``.
fla's delta rule is ``S_t = S_{t-1} + β_t (v_t − S_{t-1} k_t) k_tᵀ``, ``o_t = scale · S_t q_t``.
Mapping: ``k = k̂`` (normalised by us: ``k / max(||k||, norm_eps)`` in float32, then cast —
**not** ``use_qk_l2norm_in_kernel``, which also normalises ``q`` and puts its ``eps = 1e-6``
inside the square root), ``β = 1``, ``scale = 1.0`` (fla's default is ``K ** -0.5``).

The ``vla`` variant (spec §2.3): ``S_t = S_{t-1}(I − k̂_t α̂_tᵀ) + v_t α̂_tᵀ``.  fla's IPLR rule
(``iplr/fused_recurrent.py``: ``h += (h a) bᵀ + v kᵀ`` on the ``[V, K]`` tile) is
``S_t = S_{t-1}(I + a_t b_tᵀ) + v_t k_tᵀ``, and its DPLR rule
(``dplr/fused_recurrent.py``: ``h = exp(gk) ⊙ h + b (aᵀ h) + k vᵀ`` on the ``[K, V]`` tile) is
``S_t = S_{t-1}(Diag(exp(gk_t)) + a_t b_tᵀ) + v_t k_tᵀ``.  Mapping (both)::

    q = q,   k = α̂,   v = v,   a = −k̂,   b = α̂,   gk = 0 (DPLR only),   scale = 1.0

so ``(I + a bᵀ) = (I − k̂ α̂ᵀ)`` and the write key is the gate ``α̂``.  Note fla's
``generalized_delta_rule`` README asks for ``b = λ a`` with ``λ < 0`` for stability; VLA's oblique
update (``α̂ ∦ k̂``) is outside that assumption — the regime this check stresses.

What is fla's and what is ours, for the ``vla`` adapters:

- **ours** (the float64 oracle, :func:`vla_verify.oracle.recurrence` on the exact values the
  adapter received): the penalty chain ``A_t`` (Sherman–Morrison, nudges, ``sm_floor``), the
  normalised keys ``k̂_t`` and the gates ``α̂_t`` (``normalize_gate`` honoured), rounded once to
  the inputs' dtype;
- **fla's**: the whole state recurrence ``S_t`` and the un-normalised read-out ``S_t q_t``
  (every output token and the final state);
- **ours again**: the read-out normaliser ``z_t = z_0 + Σ_{s≤t} k_s`` and
  ``o_t = (S_t q_t) / max(z_tᵀ q_t, out_eps)`` when ``normalize_output`` is True (float32), and
  the returned ``z``.  ``A`` is returned as ``None``: fla keeps no penalty state.

For the ``delta`` adapters everything but ``k̂`` and the optional normaliser is fla's; the oracle
is not used.

Where the kernels run.  On a CUDA GPU, all six.  On CPU tensors only through Triton's interpreter
(``TRITON_INTERPRET=1``, set before triton is imported), where, with fla-core 0.6.0 and Triton
3.9.0, measured here:

- ``fused_recurrent_delta_rule`` runs as is (it is not autotuned);
- ``fused_recurrent_iplr_delta_rule`` and ``fused_recurrent_dplr_delta_rule`` run, but they are
  autotuned over several launch configurations and Triton's autotuner needs a GPU driver to time
  them ("0 active drivers").  Under the interpreter without a GPU the adapter therefore restricts
  the autotuners of the kernel's own module to the first configuration fla lists (the same kernel
  code, one block size; restored after the call);
- the three chunk kernels do not run: fla's Triton code uses constructs the interpreter rejects
  (see :data:`KERNELS`), so their adapters refuse CPU requests with that reason.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..backends.registry import Backend, Capabilities, refuse_shifted_clock
from ..errors import UnsupportedConfigurationError
from ..spec import Shapes, VLAConfig

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = [
    "ADAPTERS",
    "FLA_VERSION",
    "KERNELS",
    "FlaBackend",
    "FlaKernel",
    "chunk_delta",
    "chunk_dplr_vla",
    "chunk_iplr_vla",
    "from_fla_state",
    "fused_recurrent_delta",
    "fused_recurrent_dplr_vla",
    "fused_recurrent_iplr_vla",
    "oracle_gates",
    "to_fla_state",
]

#: The fla-core version these adapters were written and checked against.
FLA_VERSION = "0.6.0"

_FLOAT64_REASON = (
    "float64 is refused: fla's kernels keep the state in float32 (b_h is tl.float32), so they "
    "cannot meet a float64 error budget"
)


@dataclass(frozen=True)
class FlaKernel:
    """One fla kernel: where it lives, what it computes, what it refuses and why."""

    name: str  # fla's public function
    module: str  # the fla module that exports it
    impl_module: str  # the module defining its forward Triton kernels
    variant: str  # the spec variant it implements here: "delta" | "vla"
    dtypes: tuple[str, ...]  # dtypes the adapter accepts
    dtype_note: str  # why the other dtypes are refused
    interpreter: str | None  # None: runs under TRITON_INTERPRET on CPU; else why not
    autotuned: bool  # its forward kernels are autotuned over several configurations
    decay: bool = False  # takes DPLR's log-decay ``gk``


_LOW = ("float32", "bfloat16", "float16")

#: The fla kernels wrapped here (fla-core 0.6.0; interpreter notes measured with Triton 3.9.0).
KERNELS: dict[str, FlaKernel] = {
    k.name: k
    for k in (
        FlaKernel(
            "fused_recurrent_delta_rule",
            "fla.ops.delta_rule",
            "fla.ops.delta_rule.fused_recurrent",
            "delta",
            _LOW,
            _FLOAT64_REASON,
            None,
            autotuned=False,
        ),
        FlaKernel(
            "chunk_delta_rule",
            "fla.ops.delta_rule",
            "fla.ops.delta_rule.chunk",
            "delta",
            ("bfloat16", "float16"),
            "fla refuses float32 (chunk.py asserts 'ChunkDeltaRuleFunction does not support "
            "float32. Please use bfloat16.'); " + _FLOAT64_REASON,
            "fla's chunk kernels do not run under Triton's interpreter: "
            "fla/ops/common/chunk_delta_h.py:176 calls .to() on a Python-int loop index "
            "(i_t.to(tl.int64)), which compiled Triton accepts and the interpreter rejects "
            "(InterpreterError: 'int' object has no attribute 'to'); needs a CUDA GPU",
            autotuned=True,
        ),
        FlaKernel(
            "fused_recurrent_iplr_delta_rule",
            "fla.ops.generalized_delta_rule",
            "fla.ops.generalized_delta_rule.iplr.fused_recurrent",
            "vla",
            _LOW,
            _FLOAT64_REASON,
            None,
            autotuned=True,
        ),
        FlaKernel(
            "chunk_iplr_delta_rule",
            "fla.ops.generalized_delta_rule",
            "fla.ops.generalized_delta_rule.iplr.chunk",
            "vla",
            _LOW,
            _FLOAT64_REASON,
            "fla's chunk kernels do not run under Triton's interpreter: "
            "fla/ops/generalized_delta_rule/iplr/chunk.py:91 calls .to() on a Python-int loop "
            "index (i_t.to(tl.int64)), which the interpreter rejects (InterpreterError: 'int' "
            "object has no attribute 'to'); needs a CUDA GPU",
            autotuned=True,
        ),
        FlaKernel(
            "fused_recurrent_dplr_delta_rule",
            "fla.ops.generalized_delta_rule",
            "fla.ops.generalized_delta_rule.dplr.fused_recurrent",
            "vla",
            _LOW,
            _FLOAT64_REASON,
            None,
            autotuned=True,
            decay=True,
        ),
        FlaKernel(
            "chunk_dplr_delta_rule",
            "fla.ops.generalized_delta_rule",
            "fla.ops.generalized_delta_rule.dplr.chunk",
            "vla",
            _LOW,
            _FLOAT64_REASON + " (fla also warns that float32 is unsupported 'on some platforms')",
            "fla's chunk kernels do not run under Triton's interpreter: "
            "fla/ops/generalized_delta_rule/dplr/chunk_A_fwd.py:120 calls fla's gather helper, "
            "which the interpreter rejects (InterpreterError: 'Did you forget to add "
            "@triton.jit ?'); needs a CUDA GPU",
            autotuned=True,
            decay=True,
        ),
    )
}

_DEFAULT_KERNEL = {"delta": "fused_recurrent_delta_rule", "vla": "fused_recurrent_iplr_delta_rule"}


# -- layouts (written once) ---------------------------------------------------------------------


def to_fla_state(S: torch.Tensor) -> torch.Tensor:
    """Our state ``S`` ``[B, H, dv, dk]`` (spec §1) as fla's ``h`` ``[N=B, H, K=dk, V=dv]``.

    ``h = Sᵀ`` per batch element and head, float32, contiguous (fla reads an initial state into
    float32 and indexes it as a dense ``[N, H, K, V]`` array).  Casting a float32/bfloat16/float16
    state to float32 is exact.
    """
    import torch

    return S.transpose(-1, -2).to(torch.float32).contiguous()


def from_fla_state(h: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """fla's state ``h`` ``[N, H, K, V]`` (float32) as our ``S`` ``[B, H, dv, dk]`` in ``dtype``.

    The inverse of :func:`to_fla_state` up to the final cast (rounded once to ``dtype``).
    """
    return h.transpose(-1, -2).to(dtype).contiguous()


# -- what runs where ----------------------------------------------------------------------------


def _interpreting() -> bool:
    """Whether Triton runs kernels through its interpreter (``TRITON_INTERPRET``)."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on", "yes")


def _cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _missing() -> list[str]:
    return [p for p in ("torch", "triton", "fla") if importlib.util.find_spec(p) is None]


def _install_hint() -> str:
    return f"pip install --no-deps fla-core=={FLA_VERSION} && pip install einops"


def _fla_function(kernel: FlaKernel) -> Any:
    return getattr(importlib.import_module(kernel.module), kernel.name)


def _autotuners(module_name: str) -> list[Any]:
    """The Triton autotuners defined at top level of one fla module."""
    from triton.runtime.autotuner import Autotuner

    found = []
    for obj in vars(sys.modules[module_name]).values():
        for _ in range(8):  # heuristics / autotune / jit wrappers, outermost first
            if isinstance(obj, Autotuner):
                found.append(obj)
                break
            obj = getattr(obj, "fn", None)
            if obj is None:
                break
    return found


@contextlib.contextmanager
def _first_config_when_interpreting(kernel: FlaKernel) -> Iterator[None]:
    """Under the interpreter without a GPU, run ``kernel``'s autotuned kernels with one config.

    Triton's autotuner times every configuration through the GPU driver, which the interpreter
    does not have.  Here each autotuner of the kernel's own module keeps only the first
    configuration that fla's own pruning leaves (the same kernel code at one block size); the
    original pruning is restored on exit.  Outside the interpreter, or with a GPU, nothing changes.
    """
    if not (kernel.autotuned and _interpreting()) or _cuda():
        yield
        return
    tuners = _autotuners(kernel.impl_module)
    saved = [(t, t.__dict__.get("prune_configs")) for t in tuners]
    for t in tuners:
        original = t.prune_configs
        t.prune_configs = lambda kwargs, _original=original: _original(kwargs)[:1]
    try:
        yield
    finally:
        for t, previous in saved:
            if previous is None:
                t.__dict__.pop("prune_configs", None)
            else:  # pragma: no cover - nobody else patches it
                t.prune_configs = previous


# -- gates from the oracle ----------------------------------------------------------------------


def oracle_gates(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    u: torch.Tensor,
    *,
    config: VLAConfig,
    initial_state: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gates ``α̂_t`` and normalised keys ``k̂_t`` of spec §2.3, from the float64 oracle.

    Computed by :func:`vla_verify.oracle.recurrence` on the exact values of the given tensors
    (whatever their dtype), then rounded once to the tensors' dtype and device.

    Returns ``(gate, k_hat)``, both ``[B, T, H, dk]``.
    """
    import torch

    from ..arrays import to_numpy
    from ..backends.numpy_oracle import recurrence

    state = None if initial_state is None else tuple(to_numpy(x) for x in initial_state)
    result = recurrence(
        *(to_numpy(x) for x in (q, k, v, u)),
        config=config,
        variant="vla",
        initial_state=state,  # type: ignore[arg-type]
        dtype="float64",
        return_states=True,
    )
    assert result.history is not None

    def back(x: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(np.ascontiguousarray(x), device=q.device).to(q.dtype)

    return back(result.history.gate), back(result.history.k_hat)


def _normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / max(||x||, eps)`` over the last axis (spec §2.2 ``norm_eps``), in float32."""
    import torch

    x = x.to(torch.float32)
    return x / torch.clamp_min(torch.linalg.vector_norm(x, dim=-1, keepdim=True), eps)


# -- the backend --------------------------------------------------------------------------------


class FlaBackend(Backend):
    """Registry name ``fla``: one fla kernel as a spec §4 callable (module docstring).

    Options: ``kernel`` — fla's function name, one of :data:`KERNELS` (default: the fused
    recurrent kernel of the bound variant, ``fused_recurrent_delta_rule`` for ``delta`` and
    ``fused_recurrent_iplr_delta_rule`` for ``vla``).

    Inputs: torch tensors ``q, k, u`` ``[B, T, H, dk]``, ``v`` ``[B, T, H, dv]`` in float32,
    bfloat16 or float16 (per kernel, :attr:`FlaKernel.dtypes`), on ``cuda`` — or on ``cpu``
    through Triton's interpreter where the kernel runs there.  Returns ``(o, (S, None, z))`` in the
    inputs' dtype and device; ``A`` is ``None`` (fla keeps no penalty state).
    """

    name = "fla"
    description = (
        "flash-linear-attention kernels (external): delta rule, and the IPLR/DPLR generalized "
        "delta rule as VLA's state update with oracle gates (spec §5)"
    )
    capabilities = Capabilities(
        array="torch",
        devices=("cuda", "cpu"),
        dtypes=_LOW,
        variants=("vla", "delta"),
        differentiable=False,
        max_head_dim=256,  # fla asserts BK <= 256 in its chunk kernels
        requires=("torch", "triton", "fla"),
        options={"kernel": None},
    )

    def __init__(self, *, variant: str = "vla", **options: Any) -> None:
        super().__init__(variant=variant, **options)
        kernel = self.options["kernel"]
        if kernel is not None and (not isinstance(kernel, str) or kernel not in KERNELS):
            raise UnsupportedConfigurationError(
                self.name,
                f"unknown fla kernel {kernel!r}; expected one of {sorted(KERNELS)}",
                argument="kernel",
            )

    def kernel(self, variant: str | None = None) -> FlaKernel:
        """The fla kernel this adapter calls for ``variant`` (default: the bound one)."""
        variant = self.variant if variant is None else variant
        name = self.options["kernel"] or _DEFAULT_KERNEL.get(variant, _DEFAULT_KERNEL["vla"])
        return KERNELS[name]

    def __repr__(self) -> str:
        return f"<fla adapter {self.kernel().name} variant={self.variant!r}>"

    # -- what it can run -----------------------------------------------------------------------
    def availability(self) -> str | None:
        missing = _missing()
        if missing:
            return (
                f"requires the package(s) {', '.join(missing)}, not installed ({_install_hint()})"
            )
        if _cuda():
            return None
        kernel = self.kernel()
        if not _interpreting():
            return (
                "no CUDA GPU here, and TRITON_INTERPRET=1 is not set (set it before triton is "
                "imported to run fla's kernels on CPU tensors through Triton's interpreter)"
            )
        return kernel.interpreter

    def check_support(
        self,
        config: VLAConfig,
        shapes: Shapes,
        dtype: str,
        device: str = "cpu",
        *,
        variant: str | None = None,
    ) -> str | None:
        variant = self.variant if variant is None else variant
        kernel = self.kernel(variant)
        if variant in self.capabilities.variants and kernel.variant != variant:
            return (
                f"fla's {kernel.name} computes the {kernel.variant!r} variant here, not "
                f"{variant!r} (pass --variant {kernel.variant})"
            )
        if dtype not in kernel.dtypes:
            return f"dtype {dtype}: {kernel.name} takes {kernel.dtypes}; {kernel.dtype_note}"
        reason = super().check_support(config, shapes, dtype, device, variant=variant)
        if reason is not None:
            return reason
        if device == "cpu":
            if not _interpreting():
                return (
                    "CPU tensors need Triton's interpreter: set TRITON_INTERPRET=1 before "
                    "triton is imported"
                )
            if kernel.interpreter is not None:
                return kernel.interpreter
        return None

    # -- running -------------------------------------------------------------------------------
    def _run(self, q, k, v, u, *, config, initial_state, start=0):  # type: ignore[no-untyped-def]
        refuse_shifted_clock(self.name, config, start)
        import torch

        kernel = self.kernel()
        fn = _fla_function(kernel)
        dtype, device = q.dtype, q.device
        B, T, H, _ = q.shape
        f32 = torch.float32
        h0 = None if initial_state is None else to_fla_state(initial_state[0])
        if kernel.variant == "delta":
            k_hat = _normalize(k, config.norm_eps).to(dtype)
            beta = torch.ones(B, T, H, dtype=dtype, device=device)
            args: dict[str, Any] = {"q": q, "k": k_hat, "v": v, "beta": beta}
        else:
            gate, k_hat = oracle_gates(q, k, v, u, config=config, initial_state=initial_state)
            args = {"q": q, "k": gate, "v": v, "a": -k_hat, "b": gate}
            if kernel.decay:
                args["gk"] = torch.zeros_like(q)
        with _first_config_when_interpreting(kernel):
            o, h = fn(**args, scale=1.0, initial_state=h0, output_final_state=True)
        z0 = (
            torch.zeros(B, H, q.shape[-1], dtype=f32, device=device)
            if initial_state is None
            else initial_state[2].to(f32)
        )
        z = z0[:, None] + torch.cumsum(k.to(f32), dim=1)  # z_t, [B, T, H, dk]
        if config.normalize_output:
            denominator = torch.clamp_min((z * q.to(f32)).sum(-1), config.out_eps)
            o = o.to(f32) / denominator[..., None]
        return o.to(dtype), (from_fla_state(h, dtype), None, z[:, -1].to(dtype))


fused_recurrent_delta = FlaBackend(variant="delta", kernel="fused_recurrent_delta_rule")
chunk_delta = FlaBackend(variant="delta", kernel="chunk_delta_rule")
fused_recurrent_iplr_vla = FlaBackend(variant="vla", kernel="fused_recurrent_iplr_delta_rule")
chunk_iplr_vla = FlaBackend(variant="vla", kernel="chunk_iplr_delta_rule")
fused_recurrent_dplr_vla = FlaBackend(variant="vla", kernel="fused_recurrent_dplr_delta_rule")
chunk_dplr_vla = FlaBackend(variant="vla", kernel="chunk_dplr_delta_rule")

#: Every adapter of this module by name (the names ``vla-verify check`` takes).
ADAPTERS: dict[str, FlaBackend] = {
    "fused_recurrent_delta": fused_recurrent_delta,
    "chunk_delta": chunk_delta,
    "fused_recurrent_iplr_vla": fused_recurrent_iplr_vla,
    "chunk_iplr_vla": chunk_iplr_vla,
    "fused_recurrent_dplr_vla": fused_recurrent_dplr_vla,
    "chunk_dplr_vla": chunk_dplr_vla,
}
