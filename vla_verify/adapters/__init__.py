"""Adapters: external kernels wrapped in the conformance interface of spec §4.

An adapter turns somebody else's kernel into a spec §4 callable
``fn(q, k, v, u, *, config, initial_state=None) -> (o, (S, A, z))`` so that
:func:`vla_verify.validate` and ``vla-verify check MODULE:NAME`` can judge it against the float64
oracle.  Each adapter module does the layout and argument conversions once, documents which part
of the computation is the external kernel's and which is ours, and declares what it refuses.

=====================  ==================================================================  ======
module                 wraps                                                               needs
=====================  ==================================================================  ======
:mod:`.fla`            flash-linear-attention (PyPI ``fla-core``): the delta rule, and the   torch,
                       IPLR/DPLR generalized delta rule as VLA's state update (spec §5)     triton,
                                                                                           fla
=====================  ==================================================================  ======

Importing this package imports nothing external; each adapter module imports its library when an
adapter is first called (so ``import vla_verify.adapters.fla`` works where fla is absent, and the
registry reports the missing package as a reason).
"""

from __future__ import annotations

__all__: list[str] = []
