"""pytest-benchmark of the chunked kernel (``triton_chunked``), timed by CUDA events.

As ``test_bench_triton.py``: ``triton.testing.do_bench`` (warm-up, CUDA-event timings, median)
inside pytest-benchmark's ``pedantic`` call, the device median reported through a custom
timer, so ``--benchmark-compare-fail=median:10%`` gates on GPU time.  B = 1, H = 16, bf16,
paper preset, forward and forward + backward (the backward is the recurrent kernel's adjoint
from the chunked forward's checkpoints, with the training plan of
:func:`~vla_verify.backends.triton_fused.plan_for`).  Skipped without a CUDA GPU.

    pytest benchmarks/test_bench_triton_chunked.py --benchmark-autosave
    pytest benchmarks/test_bench_triton_chunked.py --benchmark-compare \\
        --benchmark-compare-fail=median:10%
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
pytest.importorskip("pytest_benchmark")

if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("benchmarks need a CUDA GPU", allow_module_level=True)

from vla_verify import VLAConfig  # noqa: E402
from vla_verify.bench import DeviceClock, _inputs  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.triton]

GRID = [(D, T) for D in (64, 128) for T in (1024, 4096, 16384)]


@pytest.mark.parametrize("mode", ["fwd", "fwdbwd"])
@pytest.mark.parametrize(("D", "T"), GRID, ids=[f"D{d}-T{t}" for d, t in GRID])
def test_vla_triton_chunked(benchmark, D: int, T: int, mode: str) -> None:
    import triton

    from vla_verify.backends.triton_chunked import chunked_vla
    from vla_verify.bench import _grad_op

    x = _inputs(1, T, 16, D, torch.bfloat16, "cuda")
    config = VLAConfig()

    def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, u: torch.Tensor):  # type: ignore[no-untyped-def]
        return chunked_vla(q, k, v, u, config=config)[0]

    if mode == "fwd":
        q, k, v, u = (x[n] for n in "qkvu")

        def fn() -> torch.Tensor:
            return forward(q, k, v, u)
    else:
        leaves = [x[n].detach().clone().requires_grad_() for n in "qkvu"]
        fn = _grad_op(forward, leaves, x["do"])

    fn()  # compile and warm up before any timing
    torch.cuda.synchronize()
    clock = DeviceClock()
    benchmark._timer = clock  # pytest-benchmark reads durations from this timer

    def one_round() -> None:
        ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
        clock.advance(ms / 1e3)

    benchmark.extra_info.update(
        {"B": 1, "T": T, "H": 16, "D": D, "dtype": "bfloat16", "mode": mode, "op": "chunked"}
    )
    benchmark.pedantic(one_round, rounds=5, iterations=1, warmup_rounds=1)
