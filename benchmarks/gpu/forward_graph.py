"""How much of the forward's median is the host's: every op of the grid eager and replayed from a
CUDA graph, side by side.

The chunked forward launches about a dozen kernels and a hundred small PyTorch operations per
call; where the device finishes its work before the host has issued the next launch, the
median measures the host. A CUDA graph replays the same launches with no host work between
them, so the eager median against the graph's bounds what the host costs each op (fla's kernels
and SDPA get the same treatment: the ratios compare like with like). First each graph's output
against the eager call's (they must agree to the bit: the same kernels on the same inputs).

B = 1, H = 16, bf16, paper preset, forward only; ``triton.testing.do_bench`` medians. Usage::

    python benchmarks/gpu/forward_graph.py --out DIR [--D 64 128] [--T 1024 4096 16384]
        [--commit SHA]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def graphed(fn: Any) -> tuple[Any, Any]:
    """``fn`` captured in a CUDA graph after three warm-up calls on a side stream (the
    allocations and autotuning happen there): returns the replay and the captured output."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph.replay, out


def eager_and_replayed(fn: Any) -> dict[str, Any]:
    """``fn`` against its CUDA-graph replay (:func:`graphed`): ``graph_equals_eager``, whether
    the replay's output is the eager call's bit for bit, then ``eager_ms`` and ``graph_ms``, the
    two medians; ``graph_error`` where either fails."""
    import torch

    from vla_verify.bench import time_ms

    try:
        eager = fn()
        replay, captured = graphed(fn)
        replay()
        torch.cuda.synchronize()
        return {
            "graph_equals_eager": bool(torch.equal(captured, eager)),
            "eager_ms": time_ms(fn),
            "graph_ms": time_ms(replay),
        }
    except Exception as exc:
        return {"graph_error": repr(exc)[:400]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--D", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--T", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--commit", default=None)
    a = ap.parse_args()
    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    from chunk_h200 import _grid_fns

    from vla_verify import VLAConfig
    from vla_verify.bench import _inputs, machine_info

    cfg = VLAConfig()
    rows: list[dict[str, Any]] = []
    result = {"machine": {**machine_info(), "commit": a.commit}, "rows": rows}
    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out / "forward_graph.json"
    for D in a.D:
        for T in a.T:
            x = _inputs(1, T, 16, D, torch.bfloat16, "cuda")
            for op, fn in _grid_fns(x, cfg, T, D).items():
                row = {"D": D, "T": T, "op": op, **eager_and_replayed(fn)}
                rows.append(row)
                print(row, flush=True)
                path.write_text(json.dumps(result, indent=1))
            del x
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
