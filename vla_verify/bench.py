"""``vla-verify bench``: time the kernels on the standard grid (issue 5) and print a table.

The grid is B = 1, H = 16, D ∈ {64, 128}, bf16, T ∈ {1k, 4k, 16k, 64k}, modes ``fwd`` and
``fwdbwd``, for the ops

- ``vla_triton_fused`` — this project's fused recurrent kernel (spec §2.3, all T steps in one
  launch);
- ``vla_torch_sequential`` — the PyTorch sequential backend (only where affordable: T = 1024);
- ``fla_fused_recurrent_dplr`` / ``fla_fused_recurrent_delta`` — flash-linear-attention's fused
  recurrent kernels (when ``import fla`` works), fed valid inputs (unit keys, ``a = −k̂, b = k̂``);
- ``sdpa`` — causal softmax attention (``torch.nn.functional.scaled_dot_product_attention``).

Times are medians of :func:`triton.testing.do_bench` (CUDA events, warm-up first, L2 flushed
between repetitions), never the host clock.  Every input set is built before timing; every op is
warmed up once before any is timed.  Records follow ``{op, B, T, H, D, dtype, mode, median_ms}``.

Without a GPU the command says so and exits 2; ``--smoke`` instead runs a tiny grid on CPU under
Triton's interpreter (host-clock timings, for testing this code path only — not a benchmark).

Importing this module imports neither torch nor triton (the CLI imports it to build its parser).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "OPS",
    "DeviceClock",
    "Record",
    "add_arguments",
    "format_table",
    "machine_info",
    "main",
    "make_ops",
    "run_grid",
    "time_ms",
]

OPS = (
    "vla_triton_fused",
    "vla_torch_sequential",
    "fla_fused_recurrent_dplr",
    "fla_fused_recurrent_delta",
    "sdpa",
)
STANDARD_T = (1024, 4096, 16384, 65536)
STANDARD_D = (64, 128)


@dataclass
class Record:
    """One timed point of the grid."""

    op: str
    B: int
    T: int
    H: int
    D: int
    dtype: str
    mode: str  # "fwd" | "fwdbwd"
    median_ms: float


def machine_info() -> dict[str, Any]:
    """GPU name, driver, CUDA, torch, triton (and fla when present), for every stored result."""
    import torch
    import triton

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "gpu": None,
        "driver": None,
        "sm_count": None,
        "triton_interpret": os.environ.get("TRITON_INTERPRET", ""),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info["gpu"] = props.name
        info["sm_count"] = props.multi_processor_count
        info["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            info["driver"] = out.stdout.strip().splitlines()[0] if out.returncode == 0 else None
        except (OSError, subprocess.SubprocessError, IndexError):
            info["driver"] = None
    try:
        import fla

        info["fla"] = getattr(fla, "__version__", "unknown")
    except Exception as exc:  # fla is optional; record why it is missing
        info["fla"] = f"unavailable ({type(exc).__name__})"
    return info


class DeviceClock:
    """A pytest-benchmark timer that reads device time: it advances only when told to (by the
    last ``do_bench`` median, in seconds), so that pytest-benchmark's statistics — and its
    ``--benchmark-compare-fail`` gate — are about GPU time, not host time."""

    def __init__(self) -> None:
        self.now = 0.0

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def __call__(self) -> float:
        return self.now


def time_ms(fn: Callable[[], Any], *, smoke: bool = False) -> float:
    """Median milliseconds of ``fn``: ``do_bench`` (CUDA events) on a GPU; in ``smoke`` mode on
    the CPU interpreter, the median of 3 host-clock runs (a code-path test, not a benchmark)."""
    if smoke:
        times = []
        for _ in range(3):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return sorted(times)[1]
    import triton

    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def _inputs(B: int, T: int, H: int, D: int, dtype: Any, device: str, seed: int = 0) -> dict:
    """Valid-domain inputs (spec §2.1): φ-features q, k > 0; unit-scaled penalties u."""
    import torch
    import torch.nn.functional as F

    g = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape: int) -> Any:
        return torch.randn(*shape, device=device, generator=g, dtype=torch.float32)

    q = F.elu(randn(B, T, H, D)) + 1
    k = F.elu(randn(B, T, H, D)) + 1
    v = randn(B, T, H, D)
    u = F.normalize(randn(B, T, H, D), dim=-1) / D**0.5
    k_unit = F.normalize(k, dim=-1)
    q_unit = F.normalize(q, dim=-1)
    return {
        "q": q.to(dtype),
        "k": k.to(dtype),
        "v": v.to(dtype),
        "u": u.to(dtype),
        "q_unit": q_unit.to(dtype),
        "k_unit": k_unit.to(dtype),
        "do": randn(B, T, H, D).to(dtype),
    }


def make_ops(
    x: dict, *, smoke: bool = False, triton_options: dict | None = None
) -> dict[tuple[str, str], Callable[[], Any]]:
    """``{(op, mode): fn}`` for one input set (modes ``fwd``, ``fwdbwd``); ops that cannot run
    here (fla missing, torch sequential at long T) are left out by the caller's choice."""
    import torch
    import torch.nn.functional as F

    from .backends import get
    from .backends.triton_fused import fused_recurrent_vla

    opts = triton_options or {}
    q, k, v, u, do = x["q"], x["k"], x["v"], x["u"], x["do"]
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, u)]
    ops: dict[tuple[str, str], Callable[[], Any]] = {}

    def vla_fwd() -> Any:
        return fused_recurrent_vla(q, k, v, u, **opts)[0]

    def vla_fb() -> Any:
        o = fused_recurrent_vla(*leaves, **opts)[0]
        return torch.autograd.grad(o, leaves, do)

    ops["vla_triton_fused", "fwd"] = vla_fwd
    ops["vla_triton_fused", "fwdbwd"] = vla_fb

    seq = get("torch")

    def seq_fwd() -> Any:
        return seq(q, k, v, u)[0]

    def seq_fb() -> Any:
        o = seq(*leaves)[0]
        return torch.autograd.grad(o, leaves, do)

    ops["vla_torch_sequential", "fwd"] = seq_fwd
    ops["vla_torch_sequential", "fwdbwd"] = seq_fb
    if smoke:
        return ops

    qh, kh, vh = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    sd_leaves = [t.detach().clone().requires_grad_() for t in (qh, kh, vh)]
    doh = do.transpose(1, 2).contiguous()

    def sdpa_fwd() -> Any:
        return F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)

    def sdpa_fb() -> Any:
        o = F.scaled_dot_product_attention(*sd_leaves, is_causal=True)
        return torch.autograd.grad(o, sd_leaves, doh)

    ops["sdpa", "fwd"] = sdpa_fwd
    ops["sdpa", "fwdbwd"] = sdpa_fb
    try:
        from fla.ops.delta_rule import fused_recurrent_delta_rule
        from fla.ops.generalized_delta_rule import fused_recurrent_dplr_delta_rule
    except Exception:  # fla-core not installed: those rows are simply absent
        return ops
    qu, ku = x["q_unit"], x["k_unit"]
    beta = torch.ones(*qu.shape[:3], device=qu.device, dtype=qu.dtype)
    a, b = -ku, ku.clone()
    gk = torch.zeros(qu.shape, device=qu.device, dtype=torch.float32)
    fl_leaves = [t.detach().clone().requires_grad_() for t in (qu, ku, v)]

    def dplr_fwd() -> Any:
        return fused_recurrent_dplr_delta_rule(qu, ku, v, a, b, gk, scale=1.0)[0]

    def delta_fwd() -> Any:
        return fused_recurrent_delta_rule(qu, ku, v, beta, scale=1.0)[0]

    def delta_fb() -> Any:
        o = fused_recurrent_delta_rule(*fl_leaves, beta, scale=1.0)[0]
        return torch.autograd.grad(o, fl_leaves, do)

    ops["fla_fused_recurrent_dplr", "fwd"] = dplr_fwd  # its backward is not implemented
    ops["fla_fused_recurrent_delta", "fwd"] = delta_fwd
    ops["fla_fused_recurrent_delta", "fwdbwd"] = delta_fb
    return ops


def run_grid(
    *,
    Ts: Iterable[int] = STANDARD_T,
    Ds: Iterable[int] = STANDARD_D,
    B: int = 1,
    H: int = 16,
    dtype: str = "bfloat16",
    modes: Iterable[str] = ("fwd", "fwdbwd"),
    ops: Iterable[str] = OPS,
    sequential_max_T: int = 1024,
    smoke: bool = False,
    triton_options: dict[int, dict] | None = None,
    log: Callable[[str], None] = print,
) -> list[Record]:
    """Time every (op, D, T, mode) of the grid; returns the records (failures are logged and
    skipped, never timed as zero).  ``triton_options`` maps D to options of the fused kernel."""
    import torch

    device = "cpu" if smoke else "cuda"
    tdtype = getattr(torch, dtype)
    wanted = set(ops)
    modes = tuple(modes)
    records: list[Record] = []
    for D in Ds:
        for T in Ts:
            x = _inputs(B, T, H, D, tdtype, device)
            table = make_ops(x, smoke=smoke, triton_options=(triton_options or {}).get(D))
            chosen = {
                key: fn
                for key, fn in table.items()
                if key[0] in wanted
                and key[1] in modes
                and (key[0] != "vla_torch_sequential" or T <= sequential_max_T)
            }
            # Warm up every op of this shape (compilation, autotuning) before timing any.
            for key, fn in list(chosen.items()):
                try:
                    fn()
                except Exception as exc:
                    log(f"  {key[0]} {key[1]} D={D} T={T}: FAILED {type(exc).__name__}: {exc}")
                    del chosen[key]
            if not smoke:
                torch.cuda.synchronize()
            for (op, mode), fn in chosen.items():
                ms = time_ms(fn, smoke=smoke)
                records.append(Record(op, B, T, H, D, dtype, mode, ms))
                log(f"  {op:28s} {mode:7s} D={D:4d} T={T:6d} {ms:10.3f} ms")
            del x, table, chosen
            if not smoke:
                torch.cuda.empty_cache()
    return records


def format_table(records: list[Record]) -> str:
    """One row per (D, T, mode): each op's median ms, and the fused kernel's speed-up over the
    torch sequential backend and over fla's fused recurrent DPLR / delta kernels (>1: faster)."""
    by: dict[tuple[int, int, str], dict[str, float]] = {}
    for r in records:
        by.setdefault((r.D, r.T, r.mode), {})[r.op] = r.median_ms
    short = {
        "vla_triton_fused": "vla_fused",
        "vla_torch_sequential": "torch_seq",
        "fla_fused_recurrent_dplr": "fla_dplr",
        "fla_fused_recurrent_delta": "fla_delta",
        "sdpa": "sdpa",
    }
    head = f"{'D':>4} {'T':>6} {'mode':7}" + "".join(f"{short[o]:>11}" for o in OPS)
    head += f"{'x_seq':>9}{'x_dplr':>8}{'x_delta':>8}"
    lines = [head, "-" * len(head)]
    for (D, T, mode), row in sorted(by.items()):
        cells = "".join(f"{row[o]:11.3f}" if o in row else f"{'-':>11}" for o in OPS)
        mine = row.get("vla_triton_fused")

        def ratio(op: str, width: int, row: dict[str, float] = row, mine: Any = mine) -> str:
            if mine and op in row:
                return f"{row[op] / mine:{width}.1f}"
            return f"{'-':>{width}}"

        lines.append(
            f"{D:4d} {T:6d} {mode:7}{cells}"
            + ratio("vla_torch_sequential", 9)
            + ratio("fla_fused_recurrent_dplr", 8)
            + ratio("fla_fused_recurrent_delta", 8)
        )
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``vla-verify bench``."""
    parser.add_argument(
        "--T", type=int, nargs="+", default=list(STANDARD_T), help="sequence lengths"
    )
    parser.add_argument("--D", type=int, nargs="+", default=list(STANDARD_D), help="head dims")
    parser.add_argument("--H", type=int, default=16, help="heads (default 16)")
    parser.add_argument("--B", type=int, default=1, help="batch (default 1)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--modes", nargs="+", default=["fwd", "fwdbwd"], choices=["fwd", "fwdbwd"])
    parser.add_argument("--ops", nargs="+", default=list(OPS), choices=list(OPS))
    parser.add_argument(
        "--sequential-max-T",
        type=int,
        default=1024,
        help="time the torch sequential backend only up to this T (default 1024)",
    )
    parser.add_argument("--json", metavar="FILE", help="also write {machine, records} here")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="no GPU: run a tiny grid on CPU under TRITON_INTERPRET=1 (host clock; tests the "
        "code path, measures nothing)",
    )


def main(args: argparse.Namespace) -> int:
    """Run the grid; exit 0, or 2 when there is no GPU (and no ``--smoke``)."""
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    if not args.smoke and not torch.cuda.is_available():
        print(
            "vla-verify bench: no CUDA GPU here; the benchmark grid needs one "
            "(--smoke runs a tiny interpreter grid on CPU to test the code path)",
            file=sys.stderr,
        )
        return 2
    if args.smoke:
        from .backends.triton_fused import interpreted

        if not interpreted():
            print(
                "vla-verify bench --smoke: Triton was imported before TRITON_INTERPRET=1 "
                "was set; run with TRITON_INTERPRET=1 in the environment",
                file=sys.stderr,
            )
            return 2
        Ts, Ds, H = (
            [t for t in args.T if t <= 64] or [16, 32],
            [d for d in args.D if d <= 16] or [16],
            min(args.H, 2),
        )
    else:
        Ts, Ds, H = args.T, args.D, args.H
    info = machine_info()
    print(f"machine: {json.dumps(info)}")
    records = run_grid(
        Ts=Ts,
        Ds=Ds,
        B=args.B,
        H=H,
        dtype=args.dtype,
        modes=args.modes,
        ops=args.ops,
        sequential_max_T=args.sequential_max_T,
        smoke=args.smoke,
    )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"machine": info, "records": [asdict(r) for r in records]}, fh, indent=1)
    print(format_table(records))
    return 0
