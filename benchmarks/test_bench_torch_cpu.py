"""CPU benchmarks of the PyTorch backends: chunked (spec §5) against sequential (§2.3).

Run: ``pytest benchmarks/test_bench_torch_cpu.py --benchmark-only``.  The issue's target:
B = 1, H = 4, dk = dv = 64, T = 2048, float32, forward: ``torch_chunked`` ≥ 10× faster than
``torch``.  These record speed and assert nothing about it (measured numbers are in
``benchmarks/results/cpu/torch_chunked_vs_sequential.json``); they assert only that the outputs
are finite.

Both backends run in one process, one after the other, so a change in the machine's load
between them moves the ratio: on a shared machine, repeat the run and compare medians.  The
chunked forward keeps its intermediates in a workspace between calls while autograd is off
(``torch_chunked._Workspace``), so its first call (a warm-up round here) is slower than the
rest.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from vla_verify import VLAConfig, backends  # noqa: E402

B, H, D, T = 1, 4, 64, 2048
CONFIG = VLAConfig.exact()  # the chunked form takes nudges only at chunk boundaries


def _inputs(T: int = T, dtype: torch.dtype = torch.float32, grad: bool = False):
    g = torch.Generator().manual_seed(0)
    q = torch.exp(0.5 * torch.randn(B, T, H, D, generator=g))
    k = torch.exp(0.5 * torch.randn(B, T, H, D, generator=g))
    v = torch.randn(B, T, H, D, generator=g)
    u = torch.randn(B, T, H, D, generator=g)
    u = u / u.norm(dim=-1, keepdim=True) / D**0.5  # the layer's penalties (spec §2.5)
    return [x.to(dtype).requires_grad_(grad) for x in (q, k, v, u)]


def _forward(name: str, **options):
    b = backends.get(name, **options)
    xs = _inputs()

    def run():
        with torch.no_grad():
            return b(*xs, config=CONFIG)[0]

    return run


@pytest.mark.benchmark(group="torch-cpu-forward-T2048")
def test_sequential_forward(benchmark) -> None:
    o = benchmark.pedantic(_forward("torch"), rounds=5, warmup_rounds=1)
    assert torch.isfinite(o).all()


@pytest.mark.benchmark(group="torch-cpu-forward-T2048")
@pytest.mark.parametrize("chunk_size", [16, 32, 64])
def test_chunked_forward(benchmark, chunk_size: int) -> None:
    o = benchmark.pedantic(
        _forward("torch_chunked", chunk_size=chunk_size), rounds=20, warmup_rounds=2
    )
    assert torch.isfinite(o).all()


@pytest.mark.benchmark(group="torch-cpu-fwdbwd-T2048")
@pytest.mark.parametrize("name", ["torch", "torch_chunked"])
def test_forward_backward(benchmark, name: str) -> None:
    b = backends.get(name)
    xs = _inputs(grad=True)

    def run():
        o, (S, _, _) = b(*xs, config=CONFIG)
        return torch.autograd.grad(o.sum() + S.sum(), xs)

    grads = benchmark.pedantic(run, rounds=3 if name == "torch" else 5, warmup_rounds=1)
    assert all(torch.isfinite(g).all() for g in grads)
