"""The chunked forward's block matrices on the H200: the kernel against the pairwise trees.

`triton_chunked` starts its penalty-chain blocks from block-start penalties built from each
block's ``2dk × 2dk`` matrix on ``(Π; Θ)`` (``docs/design/triton_chunked.md``, "Blocks of the
penalty chain").  The matrices come from ``penalty_block_matrix_kernel`` (the block's steps
applied column by column); ``_block_matrices_by_trees`` (products of the pieces' matrices by
pairwise batched products) is the reference.  This run, correctness first:

1. the two matrices agree (relative max difference) at T = 16384, D = 64 and 128, and each is
   timed alone;
2. the bf16 forward against the float64 oracle at T = 4096 (``chunk_h200.oracle_check``);

then medians side by side (B = 1, H = 16, bf16, paper preset): the forward of
``vla_triton_chunked`` (kernel matrices), ``vla_triton_chunked_trees`` (the same forward with
the trees' matrices), ``vla_triton_fused``, ``sdpa``, ``fla_chunk_delta`` and
``fla_chunk_dplr`` at D = 64 and 128, T = 4096, 16384, 65536; forward + backward at D = 64,
T = 4096 and 16384; the chunked forward's kernel breakdown (torch.profiler) at T = 16384.

Usage: ``python benchmarks/gpu/forward_h200.py --out DIR --commit SHA``;
``TRITON_INTERPRET=1 python benchmarks/gpu/forward_h200.py --out DIR --smoke`` runs it on the
CPU at toy sizes (a test of the script, not a measurement).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import chunk_h200

_log = chunk_h200._log
#: Sizes; ``--smoke`` replaces them with toy ones on the CPU (a test of the script).
RUN: dict[str, Any] = {
    "device": "cuda",
    "H": 16,
    "Ds": (64, 128),
    "matrix_T": 16384,
    "Ts": (4096, 16384, 65536),
    "fwdbwd_D": 64,
    "fwdbwd_Ts": (4096, 16384),
    "matrix_block": None,
    "ops": (
        "vla_triton_chunked_trees",
        "vla_triton_chunked",
        "vla_triton_fused",
        "sdpa",
        "fla_chunk_delta",
        "fla_chunk_dplr",
    ),
}
SMOKE: dict[str, Any] = {"device": "cpu", "H": 2, "Ds": (16,), "matrix_T": 96, "Ts": (64,),
                         "fwdbwd_D": 16, "fwdbwd_Ts": (64,), "matrix_block": 32}  # fmt: skip


def _trees_forward(cfg: Any) -> Any:
    """A context that makes ``triton_chunked`` take the trees' matrices."""
    import contextlib

    from vla_verify.backends import triton_chunked as tc

    @contextlib.contextmanager
    def patched() -> Any:
        kernel = tc.penalty_block_matrices

        def trees(u: Any, params: Any, *, start: int, nudge_period: int, block: int,
                  bug: int = 0) -> Any:  # fmt: skip
            B, T, H, dk = u.shape
            u64 = u.permute(0, 2, 1, 3).reshape(B * H, T, dk).double()
            return tc._block_matrices_by_trees(u64, start, nudge_period, cfg.nudge_eta, block)

        tc.penalty_block_matrices = trees
        try:
            yield
        finally:
            tc.penalty_block_matrices = kernel

    return patched


def matrices(out: dict[str, Any]) -> None:
    import torch

    from vla_verify import VLAConfig
    from vla_verify.backends import triton_chunked as tc
    from vla_verify.bench import _inputs, time_ms

    cfg = VLAConfig()
    H, dev = RUN["H"], RUN["device"]
    for D in RUN["Ds"]:
        T = RUN["matrix_T"]
        x = _inputs(1, T, H, D, torch.bfloat16, dev)
        u = x["u"].float()
        params = tc._params(cfg, u.device)
        block = RUN["matrix_block"] or tc.penalty_block_length(
            T, tc.DEFAULT_PENALTY_CHUNK, dk=D, heads=H, device=dev
        )
        P = int(cfg.nudge_period)
        u64 = u.permute(0, 2, 1, 3).reshape(H, T, D).double()
        kernel = functools.partial(
            tc.penalty_block_matrices, u, params, start=0, nudge_period=P, block=block
        )
        trees = functools.partial(tc._block_matrices_by_trees, u64, 0, P, cfg.nudge_eta, block)
        a, b = kernel(), trees()
        rec = {
            "D": D, "T": T, "block": block,
            "rel_max_diff": float((a - b).abs().amax() / b.abs().amax()),
            "kernel_ms": time_ms(kernel, device=dev),
            "trees_ms": time_ms(trees, device=dev),
        }  # fmt: skip
        out["matrices"].append(rec)
        _log("matrices", rec)


def forward(out: dict[str, Any]) -> None:
    import torch

    from vla_verify import VLAConfig
    from vla_verify.backends.triton_chunked import BLOCK_START_FALLBACKS
    from vla_verify.bench import _inputs, time_ms

    cfg = VLAConfig()
    patched = _trees_forward(cfg)
    H, dev = RUN["H"], RUN["device"]
    for D in RUN["Ds"]:
        for T in RUN["Ts"]:
            x = _inputs(1, T, H, D, torch.bfloat16, dev)
            fns = chunk_h200._grid_fns(x, cfg, T, D)
            chunked = fns["vla_triton_chunked"]
            # Trees first, then the others, so that no op runs right after a cold allocator.
            order = [op for op in ["vla_triton_chunked_trees", *fns] if op in RUN["ops"]]
            for op in order:
                before = BLOCK_START_FALLBACKS[0]
                try:
                    if op == "vla_triton_chunked_trees":
                        with patched():
                            ms = time_ms(chunked, device=dev)
                    else:
                        ms = time_ms(fns[op], device=dev)
                except Exception as exc:
                    _log("failed", op, D, T, repr(exc)[:300])
                    continue
                rec = {"op": op, "mode": "fwd", "D": D, "T": T, "H": H, "median_ms": ms,
                       "block_start_fallbacks": BLOCK_START_FALLBACKS[0] - before}  # fmt: skip
                out["records"].append(rec)
                _log(rec)
            RUN_PATH[0].write_text(json.dumps(out, indent=1))


def fwdbwd(out: dict[str, Any]) -> None:
    import torch

    from vla_verify import VLAConfig
    from vla_verify.bench import _inputs, time_ms

    cfg = VLAConfig()
    H, dev = RUN["H"], RUN["device"]
    sizes = RUN.get("fwdbwd_sizes") or [(RUN["fwdbwd_D"], T) for T in RUN["fwdbwd_Ts"]]
    chunk_h200.RUN["fwdbwd_chunked_max_T"] = max(T for _, T in sizes)
    for D, T in sizes:
        x = _inputs(1, T, H, D, torch.bfloat16, dev)
        for op, fn in chunk_h200._grid_fwdbwd_fns(x, cfg, T, D).items():
            if op not in RUN["ops"]:
                continue
            try:
                ms = time_ms(fn, device=dev)
            except Exception as exc:
                _log("failed", op, D, T, repr(exc)[:300])
                continue
            rec = {"op": op, "mode": "fwdbwd", "D": D, "T": T, "H": H, "median_ms": ms}
            out["records"].append(rec)
            _log(rec)
        RUN_PATH[0].write_text(json.dumps(out, indent=1))


def breakdown(out: dict[str, Any]) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from vla_verify import VLAConfig
    from vla_verify.backends.triton_chunked import chunked_vla
    from vla_verify.bench import _inputs

    cfg = VLAConfig()
    for D in (64, 128):
        T = 16384
        x = _inputs(1, T, 16, D, torch.bfloat16, "cuda")
        q, k, v, u = (x[n] for n in "qkvu")
        chunked_vla(q, k, v, u, config=cfg)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                chunked_vla(q, k, v, u, config=cfg)
            torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / 5 * 1e3
        kern = {}
        for e in prof.key_averages():
            if e.device_type.name == "CUDA" or "kernel" in e.key:
                kern[e.key[:100]] = getattr(e, "device_time_total", 0.0) / 5 / 1e3
        out["breakdown"][f"D{D}_T{T}_ms"] = kern
        out["breakdown"][f"D{D}_T{T}_wall_under_profiler_ms"] = wall
        _log("breakdown", D, sum(kern.values()), wall)
        RUN_PATH[0].write_text(json.dumps(out, indent=1))


RUN_PATH: list[Path] = []


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--smoke", action="store_true", help="toy sizes on the CPU interpreter")
    ap.add_argument(
        "--crossover",
        action="store_true",
        help="only the two VLA kernels (and SDPA) where they cross: forward at D = 64 and 128, "
        "T = 1024, 2048, 8192; forward + backward at D = 64, T = 1024, 2048 and D = 128, "
        "T = 1024, 4096, 16384",
    )
    a = ap.parse_args()
    if a.smoke:
        RUN.update(SMOKE)
    if a.crossover:
        RUN.update(Ts=(1024, 2048, 8192), fwdbwd_sizes=((64, 1024), (64, 2048), (128, 1024),
                   (128, 4096), (128, 16384)), ops=("vla_triton_chunked", "vla_triton_fused",
                   "sdpa"))  # fmt: skip
    from vla_verify.bench import machine_info

    out: dict[str, Any] = {"machine": {**machine_info(), "commit": a.commit}, "matrices": [],
                           "correctness": {}, "records": [], "breakdown": {}}  # fmt: skip
    path = Path(a.out) / "forward.json"
    RUN_PATH.append(path)
    chunk_h200.RUN["path"] = path
    t0 = time.time()
    if not a.crossover:
        matrices(out)
    path.write_text(json.dumps(out, indent=1))
    if not all(m["rel_max_diff"] < 1e-10 for m in out["matrices"]):
        _log("the kernel's matrices disagree with the trees': nothing timed")
        return
    if not a.smoke:
        chunk_h200.oracle_check(out)
    if not all(c["passed"] for c in out["correctness"].values()):
        _log("the forward is outside the budget: nothing timed")
        return
    out["correctness_seconds"] = round(time.time() - t0, 1)
    forward(out)
    if not a.smoke and not a.crossover:
        breakdown(out)
    fwdbwd(out)
    out["seconds"] = round(time.time() - t0, 1)
    path.write_text(json.dumps(out, indent=1))
    _log("done", out["seconds"])


if __name__ == "__main__":
    main()
