"""pytest-benchmark of the fused recurrent kernel (issue 5), timed by CUDA events.

Each benchmark runs ``triton.testing.do_bench`` (warm-up, then CUDA-event timings, median) inside
pytest-benchmark's ``pedantic`` call and reports the *device* median through a custom timer, so
``--benchmark-compare-fail=median:10%`` gates on GPU time, not on launch overhead.  Skipped
without a CUDA GPU.

    pytest benchmarks/test_bench_triton.py --benchmark-autosave
    pytest benchmarks/test_bench_triton.py --benchmark-compare --benchmark-compare-fail=median:10%
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
pytest.importorskip("pytest_benchmark")

if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("benchmarks need a CUDA GPU", allow_module_level=True)

from vla_verify.bench import DeviceClock, _inputs, make_ops  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.triton]

GRID = [(D, T) for D in (64, 128) for T in (1024, 4096, 16384)]


@pytest.mark.parametrize("mode", ["fwd", "fwdbwd"])
@pytest.mark.parametrize(("D", "T"), GRID, ids=[f"D{d}-T{t}" for d, t in GRID])
def test_vla_triton_fused(benchmark, D: int, T: int, mode: str) -> None:
    import triton

    x = _inputs(1, T, 16, D, torch.bfloat16, "cuda")
    fn = make_ops(x)["vla_triton_fused", mode]
    fn()  # compile and warm up before any timing
    torch.cuda.synchronize()
    clock = DeviceClock()
    benchmark._timer = clock  # pytest-benchmark reads durations from this timer

    def one_round() -> None:
        ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
        clock.advance(ms / 1e3)

    benchmark.extra_info.update(
        {"B": 1, "T": T, "H": 16, "D": D, "dtype": "bfloat16", "mode": mode}
    )
    benchmark.pedantic(one_round, rounds=5, iterations=1, warmup_rounds=1)
