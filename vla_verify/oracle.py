"""The oracle's public API: the float64 recurrence and the closed forms it is checked against.

Kernel authors import this module to check their own implementations::

    from vla_verify import oracle
    o, (S, A, z), _ = oracle.recurrence(q, k, v, u, config=VLAConfig())

- :func:`recurrence` — spec §2.3–§2.4 token by token (float64, or the same algorithm in float32,
  float16 or bfloat16 as the same-precision baseline of spec §4);
- :func:`recurrence_mp`, :func:`penalty_inverse_mp`, :func:`argmin_state_mp`,
  :func:`jacobian_spectral_norm_mp` — the same at ``dps`` digits (mpmath);
- :func:`penalty_inverse` — ``M_t^{-1}`` by Cholesky solves (claim C1);
- :func:`argmin_state` — the minimiser of spec §3 C3 by Cholesky solves;
- :func:`step_jacobian`, :func:`jacobian_spectral_norm` — the Jacobian of one state update
  (claim C4).
"""

from .backends.mpmath_backend import (
    argmin_state_mp,
    jacobian_spectral_norm_mp,
    penalty_inverse_mp,
    recurrence_mp,
)
from .backends.numpy_oracle import OracleResult, StateHistory, recurrence, round_to_dtype
from .closed_forms import (
    argmin_state,
    jacobian_spectral_norm,
    penalty_inverse,
    penalty_matrix,
    step_jacobian,
    unit_normalize,
)

__all__ = [
    "OracleResult",
    "StateHistory",
    "argmin_state",
    "argmin_state_mp",
    "jacobian_spectral_norm",
    "jacobian_spectral_norm_mp",
    "penalty_inverse",
    "penalty_inverse_mp",
    "penalty_matrix",
    "recurrence",
    "recurrence_mp",
    "round_to_dtype",
    "step_jacobian",
    "unit_normalize",
]
