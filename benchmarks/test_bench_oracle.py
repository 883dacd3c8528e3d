"""CPU benchmarks of the foundation: the float64 oracle and ``validate``.

Run: ``pytest benchmarks/test_bench_oracle.py --benchmark-only``.  Targets (2-core machine):
the oracle at B=4, H=8, T=4096, dk=dv=64 in ≤ 5 s; ``validate`` with the default
``max_examples`` for a NumPy implementation in ≤ 60 s.  These are measurements, reported in the
README and ``benchmarks/results/cpu/``; the assertion only guards against a tenfold regression.
"""

from __future__ import annotations

import numpy as np

from vla_verify import VLAConfig, backends, oracle, validate


def _inputs(B=4, T=4096, H=8, d=64, seed=0):
    rng = np.random.default_rng(seed)
    q = np.exp(rng.standard_normal((B, T, H, d)))
    k = np.exp(rng.standard_normal((B, T, H, d)))
    u = rng.standard_normal((B, T, H, d))
    u /= np.linalg.norm(u, axis=-1, keepdims=True) * np.sqrt(d)
    v = rng.standard_normal((B, T, H, d))
    return q, k, v, u


def test_oracle_float64_B4_H8_T4096_d64(benchmark) -> None:
    args = _inputs()
    result = benchmark.pedantic(
        oracle.recurrence, args=args, kwargs={"config": VLAConfig()}, rounds=3, warmup_rounds=0
    )
    assert np.all(np.isfinite(result.o))
    assert benchmark.stats["median"] < 50.0


def test_validate_default_examples_numpy_fn(benchmark) -> None:
    fn = backends.get("numpy")
    report = benchmark.pedantic(validate, args=(fn,), kwargs={"seed": 0}, rounds=3)
    assert report.passed and report.examples >= 100
    assert benchmark.stats["median"] < 600.0
