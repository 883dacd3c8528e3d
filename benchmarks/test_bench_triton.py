"""pytest-benchmark of the recurrent Triton kernels, timed by CUDA events.

Each benchmark runs ``triton.testing.do_bench`` (warm-up, then CUDA-event timings, median) inside
pytest-benchmark's ``pedantic`` call and reports the *device* median through a custom timer, so
``--benchmark-compare-fail=median:3%`` gates on GPU time, not on launch overhead.  Skipped
without a CUDA GPU.

    pytest benchmarks/test_bench_triton.py --benchmark-only --benchmark-autosave
    pytest benchmarks/test_bench_triton.py --benchmark-only --benchmark-compare=0008 \
        --benchmark-compare-fail=median:3%

``test_registry_call_overhead`` times the same forward called through the registry
(``backends.get("triton_fused")(q, k, v, u, config=...)``, the spec §4 callable with its input
checks and the state cast to the inputs' dtype) beside :func:`fused_recurrent_vla`, alternating,
and fails when the registry call adds more than 3%.
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
#: The registry call may add at most this fraction to the kernel call's device median.
REGISTRY_OVERHEAD = 0.03


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


def test_registry_call_overhead(benchmark) -> None:
    """The registry call's device median against the kernel call's, T = 1024, D = 64, B = 1,
    H = 16, bf16 (the shortest forward of the grid, where a fixed host cost weighs most)."""
    import triton

    from vla_verify import VLAConfig, backends
    from vla_verify.backends.triton_fused import fused_recurrent_vla

    x = _inputs(1, 1024, 16, 64, torch.bfloat16, "cuda")
    q, k, v, u = x["q"], x["k"], x["v"], x["u"]
    config = VLAConfig()
    backend = backends.get("triton_fused")

    def kernel_call() -> None:
        fused_recurrent_vla(q, k, v, u, config=config)

    def registry_call() -> None:
        backend(q, k, v, u, config=config)

    for fn in (kernel_call, registry_call):
        fn()
    torch.cuda.synchronize()
    medians: dict[str, list[float]] = {"kernel": [], "registry": []}
    clock = DeviceClock()
    benchmark._timer = clock

    def one_round() -> None:
        # alternating, so that clock drift or a neighbour's load falls on both alike
        for name, fn in (("kernel", kernel_call), ("registry", registry_call)):
            ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
            medians[name].append(ms)
        clock.advance(medians["registry"][-1] / 1e3)

    benchmark.pedantic(one_round, rounds=5, iterations=1, warmup_rounds=1)
    kernel_ms = sorted(medians["kernel"])[len(medians["kernel"]) // 2]
    registry_ms = sorted(medians["registry"])[len(medians["registry"]) // 2]
    overhead = registry_ms / kernel_ms - 1.0
    benchmark.extra_info.update(
        {"B": 1, "T": 1024, "H": 16, "D": 64, "dtype": "bfloat16", "mode": "fwd",
         "kernel_call_ms": medians["kernel"], "registry_call_ms": medians["registry"],
         "kernel_call_median_ms": kernel_ms, "registry_call_median_ms": registry_ms,
         "registry_overhead": overhead}
    )  # fmt: skip
    assert overhead <= REGISTRY_OVERHEAD, (
        f"the registry call adds {overhead:.1%} ({registry_ms:.3f} against {kernel_ms:.3f} ms)"
    )
