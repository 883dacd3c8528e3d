"""Where a stacked training step's time goes on a GPU (experiments' throughput).

For each mixer at ``T`` ∈ {256, 1024} (B = 64, a stack of 3 at the grids' recipe), this prints
and writes to ``<out>/profile_training_step.json``:

- ``eager_ms``: one step (forward, backward, clipping, AdamW) with a sync after each;
- ``enqueue_ms``: the host's time to queue one step without syncing (when it is close to
  ``eager_ms`` the step is bound by the host's kernel launches, not by the GPU);
- ``graph_ms``: the same step captured once as a CUDA graph and replayed (no host work per
  kernel), or the reason capture failed;
- ``kernels``: the ten kernels with the most GPU time in 5 profiled eager steps.

Measured: ``benchmarks/results/h200/training_step.json``.

Usage: ``python benchmarks/profile_training_step.py OUT [T ...]``; ``PRECISIONS`` (default
``highest,high``) names the float32 matmul precisions to time.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

import torch

from vla_verify.experiments.model import Backbone, ModelConfig
from vla_verify.experiments.runner import provenance
from vla_verify.experiments.stacked import StackedAdamW, StackedBackbone, clip_grad_norms
from vla_verify.experiments.tasks import MQARTask
from vla_verify.experiments.train import TrainConfig, _member_losses

MEMBERS = 3


def build(mixer: str, T: int) -> tuple[StackedBackbone, StackedAdamW, torch.Tensor, torch.Tensor]:
    models = []
    for seed in range(MEMBERS):
        torch.manual_seed(seed)
        models.append(Backbone(ModelConfig(mixer=mixer, short_conv=4), "cuda").cuda())
    stack = StackedBackbone(models)
    cfg = TrainConfig()
    optimizer = StackedAdamW(
        stack.flat, stack.flat_grad, stack.matrix_mask, weight_decay=cfg.weight_decay
    )
    optimizer.lr.fill_(1e-4)
    task = MQARTask(8, T)
    batches = [task.batch(64, seed, 0) for seed in range(MEMBERS)]
    tokens = torch.stack([torch.as_tensor(b.tokens) for b in batches]).cuda()
    targets = torch.stack([torch.as_tensor(b.targets) for b in batches]).cuda()
    return stack, optimizer, tokens, targets


def step(stack: StackedBackbone, optimizer: StackedAdamW, tokens, targets) -> torch.Tensor:
    losses = _member_losses(stack(tokens), targets)
    optimizer.zero_grad()
    losses.sum().backward()
    clip_grad_norms(stack.flat_grad, 1.0)
    optimizer.step()
    return losses


def timed(fn, repeats: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
        torch.cuda.synchronize()
    return 1e3 * (time.perf_counter() - t0) / repeats


def enqueue_ms(fn, repeats: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    host = time.perf_counter() - t0
    torch.cuda.synchronize()
    return 1e3 * host / repeats


def graph_ms(stack, optimizer, tokens, targets, repeats: int) -> float | str:
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step(stack, optimizer, tokens, targets)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step(stack, optimizer, tokens, targets)
        graph.replay()
        return timed(graph.replay, repeats)
    except Exception as error:
        return f"{type(error).__name__}: {str(error)[:300]}"


def kernels(fn) -> list[tuple[str, float]]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    rows = [
        (e.key[:90], e.self_device_time_total / 5e3)
        for e in prof.key_averages()
        if e.self_device_time_total > 0
    ]
    rows.sort(key=lambda r: -r[1])
    total = sum(r[1] for r in rows)
    return [("TOTAL", total), *rows[:10]]


def main() -> None:
    out = Path(sys.argv[1])
    Ts = [int(t) for t in sys.argv[2:]] or [256, 1024]
    report: dict = {"members": MEMBERS, "batch": 64, "provenance": provenance("cuda")}
    for T in Ts:
        for precision in os.environ.get("PRECISIONS", "highest,high").split(","):
            torch.set_float32_matmul_precision(precision)
            for mixer in ("softmax", "linear", "deltanet", "vla"):
                stack, optimizer, tokens, targets = build(mixer, T)

                def run(stack=stack, optimizer=optimizer, tokens=tokens, targets=targets):
                    return step(stack, optimizer, tokens, targets)

                for _ in range(3):
                    run()
                repeats = max(3, math.ceil(20 * 256 / T))
                row = {"eager_ms": timed(run, repeats), "enqueue_ms": enqueue_ms(run, repeats)}
                if precision == "highest":
                    row["kernels"] = kernels(run)
                row["graph_ms"] = graph_ms(stack, optimizer, tokens, targets, repeats)
                report[f"{mixer}_T{T}_{precision}"] = row
                print(mixer, T, precision, json.dumps(row)[:1500], flush=True)
    (out / "profile_training_step.json").write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
