"""Training experiments of spec §3 C6, C7 and C10: MQAR, copy and the state-norm probe.

Modules (PyTorch is imported only by those that train, so ``import vla_verify.experiments``
needs NumPy alone):

- :mod:`.tasks` — the task generators with fixed seeds and the exact-match metric (NumPy);
- :mod:`.model` — the spec §2.5 layer and 2-layer backbone as ``nn.Module`` (torch);
- :mod:`.train` — the optimisation recipe of spec §2.5 and the evaluation (torch);
- :mod:`.probe` — ``||S_t||_F`` per layer over t (torch);
- :mod:`.grids` — the grids and their jobs; :mod:`.runner` — cached, resumable runs over CPUs
  and GPUs; :mod:`.results` — aggregation over seeds (NumPy); :mod:`.report` — tables, plots.

Command line: ``python -m vla_verify.experiments run --grid mqar --device cuda``, then
``python -m vla_verify.experiments report`` (``--help`` for the options).
"""
