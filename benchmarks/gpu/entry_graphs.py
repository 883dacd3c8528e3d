"""The entry point's CUDA graphs (:func:`vla_verify.ops.vla`, module docstring) on a GPU:
correctness first, then side-by-side medians.

1. For each size, three calls of ``ops.vla(..., kernel="chunked")`` on fresh inputs (the first
   eager, the second captured, the third replayed) against ``chunked_vla`` called directly: the
   output and the state equal bit for bit; once more with an initial state and ``start = 7``
   (a call the entry point runs eagerly).  Where ``ops.GRAPH_MAX_TOKEN_HEADS`` has no row for
   the width, every call is eager and no graph is kept.  A red check times nothing.
2. ``triton.testing.do_bench`` medians (B = 1, H = 16, bf16, paper preset), in turn twice:
   the entry point with graphs, without them, ``chunked_vla`` directly, the entry point's
   recurrent kernel (where the crossover falls), and fla's
   ``chunk_delta_rule`` and ``chunk_dplr_delta_rule`` on the same inputs (``vla_verify.bench``).

Usage: ``python benchmarks/gpu/entry_graphs.py OUT.json [--sizes 64x4096 ...]``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

SIZES = ("64x1024", "64x2048", "64x4096", "64x8192", "128x1024", "128x2048", "128x4096")


def _same(got: tuple[Any, ...], want: tuple[Any, ...]) -> bool:
    import torch

    return all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def _check(D: int, T: int) -> dict[str, Any]:
    import torch

    from vla_verify import VLAConfig, ops
    from vla_verify.backends.triton_chunked import chunked_vla
    from vla_verify.bench import _inputs

    cfg = VLAConfig()
    ops.clear_graphs()
    row: dict[str, Any] = {"D": D, "T": T, "equal": []}
    for seed in range(3):
        x = _inputs(1, T, 16, D, torch.bfloat16, "cuda", seed=seed)
        args = [x[n] for n in "qkvu"]
        o, state = ops.vla(*args, config=cfg, kernel="chunked")
        o_ref, state_ref = chunked_vla(*args, config=cfg)
        row["equal"].append(_same((o, *state), (o_ref, *state_ref)))
    init = tuple(t.clone() for t in state_ref)  # float32, as returned
    for _ in range(3):
        o, state = ops.vla(*args, config=cfg, kernel="chunked", initial_state=init, start=7)
    o_ref, state_ref = chunked_vla(*args, config=cfg, initial_state=init, start=7)
    row["equal_with_state"] = _same((o, *state), (o_ref, *state_ref))
    row["graphs_kept"] = len([g for g in ops._GRAPHS.graphs.values() if g is not None])
    return row


def _times(D: int, T: int) -> dict[str, Any]:
    import torch

    from vla_verify import VLAConfig, ops
    from vla_verify.backends.triton_chunked import chunked_vla
    from vla_verify.bench import _fla_ops, _inputs, time_ms

    cfg = VLAConfig()
    x = _inputs(1, T, 16, D, torch.bfloat16, "cuda")
    args = [x[n] for n in "qkvu"]
    fns = {
        "ops_vla_graphs": lambda: ops.vla(*args, config=cfg, kernel="chunked"),
        "ops_vla_eager": lambda: ops.vla(*args, config=cfg, kernel="chunked", graphs=False),
        "chunked_vla": lambda: chunked_vla(*args, config=cfg),
        "ops_vla_recurrent": lambda: ops.vla(*args, config=cfg, kernel="recurrent"),
    }
    for (name, mode), fn in _fla_ops(x, {"fla_chunk_delta", "fla_chunk_dplr"}).items():
        if mode == "fwd":
            fns[name] = fn
    row: dict[str, Any] = {"D": D, "T": T}
    for _ in range(2):
        for name, fn in fns.items():
            row.setdefault(name, []).append(time_ms(fn))
    torch.cuda.synchronize()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--sizes", nargs="+", default=list(SIZES))
    a = ap.parse_args()
    from vla_verify.bench import machine_info

    sizes = [tuple(int(n) for n in s.split("x")) for s in a.sizes]
    result: dict[str, Any] = {"machine": machine_info(), "checks": [], "times": []}
    out = Path(a.out)
    for D, T in sizes:
        result["checks"].append(_check(D, T))
        print(json.dumps(result["checks"][-1]), flush=True)
    out.write_text(json.dumps(result, indent=1))
    ok = all(all(c["equal"]) and c["equal_with_state"] for c in result["checks"])
    if not ok:
        raise SystemExit("the entry point's replays differ from the kernel's eager calls")
    for D, T in sizes:
        result["times"].append(_times(D, T))
        print(json.dumps(result["times"][-1]), flush=True)
        out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
