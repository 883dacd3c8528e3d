"""The chunked kernel's forward and forward + backward medians and the forward's device time,
of the checkout this runs from, for comparing commits on one machine side by side.

Run it from two checkouts in one session on the same GPU (B = 1, H = 16, bf16, paper preset;
``triton.testing.do_bench`` medians after its warm-up, each taken twice and the lower kept;
the forward's device time summed over its kernels by torch.profiler, mean of five calls;
the number of the first forward's block-start fallbacks)::

    python benchmarks/gpu/chunked_timings.py OUT.json --label NAME [--sizes 64x4096 ...]
        [--modes fwd fwdbwd] [--penalty-dtypes float64 float32]
        [--anchors fla_chunk_delta fla_chunk_dplr sdpa]

``--anchors`` times those ops of ``vla_verify.bench`` on the same inputs in the same process,
so that the chunked kernel's ratios to them are side by side (``anchor_rows``), and the
output of each row is kept as ``o_checksum`` (the sum of ``|o|`` in float64), and with
``fwdbwd`` the gradients' as ``grad_checksums`` (``q, k, v, u``), so that two checkouts that
should compute the same numbers can be seen to.  ``--set NAME=JSON`` changes
a plan constant of :mod:`vla_verify.backends.triton_chunked` (``triton_fused.NAME``: of the
recurrent backend, whose adjoint the chunked one runs) for the run (recorded as ``set``), so
that launch variants compare from one checkout.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def _row(D: int, T: int, modes: tuple[str, ...], options: dict[str, Any]) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from vla_verify import VLAConfig
    from vla_verify.backends.triton_chunked import BLOCK_START_FALLBACKS, chunked_vla
    from vla_verify.bench import _grad_op, _inputs, time_ms

    cfg = VLAConfig()
    x = _inputs(1, T, 16, D, torch.bfloat16, "cuda")
    args = [x[n] for n in "qkvu"]

    def fwd() -> Any:
        return chunked_vla(*args, config=cfg, **options)[0]

    def forward(q: Any, k: Any, v: Any, u: Any) -> Any:
        return chunked_vla(q, k, v, u, config=cfg, **options)[0]

    leaves = [x[n].detach().clone().requires_grad_(True) for n in "qkvu"]
    fwdbwd = _grad_op(forward, leaves, x["do"]) if "fwdbwd" in modes else fwd
    before = BLOCK_START_FALLBACKS[0]
    row: dict[str, Any] = {"D": D, "T": T, **options}
    row["o_checksum"] = float(fwd().double().abs().sum())
    # The forwards whose block starts failed their check (and ran the sequential second pass).
    row["block_start_fallbacks"] = BLOCK_START_FALLBACKS[0] - before
    if "fwdbwd" in modes:
        # The gradients' sums of |g| (float64), so that two checkouts whose backwards should
        # agree to rounding can be seen to.
        row["grad_checksums"] = [float(g.double().abs().sum()) for g in fwdbwd()]
    for mode, fn in (("fwd", fwd), ("fwdbwd", fwdbwd)):
        if mode in modes:
            row[f"{mode}_ms"] = min(time_ms(fn), time_ms(fn))
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            fwd()
        torch.cuda.synchronize()
    kernels = {e.key: e.device_time_total / 5 / 1000 for e in prof.key_averages()
               if e.device_time_total > 0}  # fmt: skip
    row["fwd_device_ms"] = sum(kernels.values())
    row["fwd_kernels_ms"] = dict(sorted(kernels.items(), key=lambda kv: -kv[1])[:12])
    return row


def _anchor_rows(D: int, T: int, modes: tuple[str, ...], anchors: list[str]) -> list[dict]:
    import torch

    from vla_verify.bench import _inputs, make_ops, time_ms

    ops = make_ops(_inputs(1, T, 16, D, torch.bfloat16, "cuda"), ops=anchors)
    rows = []
    for op in anchors:
        row: dict[str, Any] = {"D": D, "T": T, "op": op}
        for mode in modes:
            if (op, mode) in ops:
                row[f"{mode}_ms"] = min(time_ms(ops[op, mode]), time_ms(ops[op, mode]))
        rows.append(row)
    return rows


def _set_constants(assignments: list[str]) -> dict[str, Any]:
    """Set each ``NAME=JSON`` on :mod:`vla_verify.backends.triton_chunked` (``triton_fused.NAME``
    on :mod:`vla_verify.backends.triton_fused`, whose adjoint the chunked backend runs); a dict
    updates the constant's entries, its keys read as integers.  Returns what was set."""
    from vla_verify.backends import triton_chunked, triton_fused

    done: dict[str, Any] = {}
    for item in assignments:
        name, _, text = item.partition("=")
        module_name, _, constant = name.rpartition(".")
        module = {"": triton_chunked, "triton_chunked": triton_chunked,
                  "triton_fused": triton_fused}.get(module_name)  # fmt: skip
        if module is None or not hasattr(module, constant):
            raise SystemExit(f"--set: no plan constant {name!r}")
        value = json.loads(text)
        if isinstance(value, dict):
            value = {**getattr(module, constant), **{int(k): v for k, v in value.items()}}
        setattr(module, constant, value)
        if module is triton_fused:
            triton_fused.plan_for.cache_clear()
        done[name] = value
    return done


def main() -> None:
    from vla_verify.bench import machine_info

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--label", required=True)
    ap.add_argument("--sizes", nargs="+", default=["64x4096", "64x16384", "128x16384"])
    ap.add_argument("--modes", nargs="+", choices=("fwd", "fwdbwd"), default=["fwd", "fwdbwd"])
    ap.add_argument(
        "--penalty-dtypes",
        nargs="+",
        choices=("float64", "float32"),
        default=[None],
        help="time each size with each penalty_dtype (default: the backend's)",
    )
    ap.add_argument("--anchors", nargs="*", default=[], help="ops of vla_verify.bench to time too")
    ap.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="NAME=JSON",
        help="set a plan constant of vla_verify.backends.triton_chunked for this run "
        "(triton_fused.NAME: of vla_verify.backends.triton_fused; a dict's keys read as "
        "integers, e.g. STATE_CHAIN_VALUE_BLOCK='{\"128\": 16}')",
    )
    a = ap.parse_args()
    res: dict[str, Any] = {"label": a.label, "machine": machine_info(), "rows": []}
    res["set"] = _set_constants(a.set)
    if a.anchors:
        res["anchor_rows"] = []
    for size in a.sizes:
        D, T = (int(s) for s in size.split("x"))
        for pd in a.penalty_dtypes:
            row = _row(D, T, tuple(a.modes), {} if pd is None else {"penalty_dtype": pd})
            res["rows"].append(row)
            print(a.label, json.dumps({k: v for k, v in row.items() if k != "fwd_kernels_ms"}),
                  flush=True)  # fmt: skip
        if a.anchors:
            for row in _anchor_rows(D, T, tuple(a.modes), a.anchors):
                res["anchor_rows"].append(row)
                print(a.label, json.dumps(row), flush=True)
        # Written after every size, so that a run cut short keeps what it measured.
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
