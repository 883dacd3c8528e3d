"""Issue 4 on the H200: correctness FIRST, then timings of the PyTorch backends; writes
``$OUT/torch_h200.json``.

    python benchmarks/gpu/torch_h200.py            # on the GPU (budget: under ~4 minutes)
    python benchmarks/gpu/torch_h200.py --smoke    # CPU, tiny: tests the script

1. Correctness (no speed is reported on a red gate): on fresh random layer-like inputs
   (spec §2.5), ``torch_chunked`` and ``torch`` against the float64 oracle, in float32 and
   bfloat16, with the spec §4 budget (:func:`vla_verify.error_model.compare`, the oracle run in
   the same precision as the baseline; the chunked form's factor scaled by its inner-product
   length, as in ``tests/test_torch_backends.py::chunk_factor``).
2. Timings: ``triton.testing.do_bench(..., return_mode="median")`` after warm-up, B = 1, H = 16,
   D = 64, T ∈ {1k, 2k, 4k, 8k, 16k}, bf16 and fp32, forward and forward+backward, ops
   ``torch_chunked`` (chunk 64), ``torch`` (only while one call is cheap enough that the whole
   measurement stays under ~20 s) and ``torch.nn.functional.scaled_dot_product_attention``
   (``is_causal=True``) — all in one run, so the ratios are of one machine state.
3. ``$OUT/torch_h200.json`` = ``{"machine": {...}, "records": [...], "correctness": [...]}``;
   a table last.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from vla_verify import VLAConfig, backends  # noqa: E402
from vla_verify.backends.numpy_oracle import recurrence  # noqa: E402
from vla_verify.error_model import DEFAULT_FACTOR, compare  # noqa: E402

CONFIG = VLAConfig.exact()
CHUNK = 64
SEQ_BUDGET_S = 20.0  # the sequential backend is timed only while a measurement stays below this


def log(msg: str) -> None:
    print(msg, flush=True)


def layer_inputs(B: int, T: int, H: int, D: int, dtype: torch.dtype, device: str, seed: int):
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.exp(0.5 * torch.randn(B, T, H, D, generator=g, dtype=torch.float64))
    k = torch.exp(0.5 * torch.randn(B, T, H, D, generator=g, dtype=torch.float64))
    v = torch.randn(B, T, H, D, generator=g, dtype=torch.float64)
    u = torch.randn(B, T, H, D, generator=g, dtype=torch.float64)
    u = u / u.norm(dim=-1, keepdim=True) / D**0.5
    return [x.to(dtype=dtype, device=device) for x in (q, k, v, u)]


def machine(device: str) -> dict:
    try:
        commit = subprocess.check_output(["git", "rev-parse", "HEAD"], cwd=ROOT, text=True).strip()
    except Exception:  # not a git checkout on the device
        commit = os.environ.get("GIT_COMMIT", "unknown")
    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "commit": commit}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
        try:
            info["driver"] = subprocess.check_output(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], text=True
            ).split()[0]
        except Exception:
            info["driver"] = None
    else:
        info["gpu"], info["driver"] = None, None
    return info


# -- 1. correctness ------------------------------------------------------------------------------


def correctness(device: str, smoke: bool) -> list[dict]:
    B, T, H, D = (1, 40, 2, 8) if smoke else (1, 300, 4, 64)
    rows = []
    for dtype_name in ("float32", "bfloat16"):
        dtype = getattr(torch, dtype_name)
        xs = layer_inputs(B, T, H, D, dtype, device, seed=1234)
        seen = [x.double().cpu().numpy() for x in xs]
        ref = recurrence(*seen, config=CONFIG)
        base = recurrence(*seen, config=CONFIG, dtype=dtype_name)
        refs = {"o": ref.o, "S": ref.state[0], "A": ref.state[1], "z": ref.state[2]}
        bases = {"o": base.o, "S": base.state[0], "A": base.state[1], "z": base.state[2]}
        for name, options in (("torch", {}), ("torch_chunked", {"chunk_size": CHUNK})):
            factor = DEFAULT_FACTOR * (max(1.0, 2 * CHUNK / (D + 1)) if options else 1.0)
            with torch.no_grad():
                o, state = backends.get(name, **options)(*xs, config=CONFIG)
            got = {"o": o, "S": state[0], "A": state[1], "z": state[2]}
            for key, x in got.items():
                c = compare(
                    key, x.double().cpu().numpy(), refs[key], bases[key], dtype_name, factor=factor
                )
                rows.append(
                    {
                        "backend": name,
                        "dtype": dtype_name,
                        "output": key,
                        "passed": c.passed,
                        "error_over_budget": c.ratio,
                    }
                )
    return rows


# -- 2. timings ----------------------------------------------------------------------------------


def bench(fn, device: str, smoke: bool) -> float:
    """Median milliseconds: ``triton.testing.do_bench`` on CUDA, a host clock in smoke mode."""
    fn()  # warm-up (allocator, kernels)
    if device == "cuda":
        import triton.testing

        torch.cuda.synchronize()
        return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - start))
    return float(np.median(times))


def make_op(op: str, mode: str, B: int, T: int, H: int, D: int, dtype, device: str):
    grad = mode == "fwdbwd"
    xs = [x.requires_grad_(grad) for x in layer_inputs(B, T, H, D, dtype, device, seed=T)]
    if op == "sdpa":
        # SDPA is head-first: [B, H, T, D].
        q, k, v = (x.detach().transpose(1, 2).contiguous().requires_grad_(grad) for x in xs[:3])

        def forward():
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

        inputs = [q, k, v]
    else:
        backend = backends.get(op, **({"chunk_size": CHUNK} if op == "torch_chunked" else {}))

        def forward():
            return backend(*xs, config=CONFIG)[0]

        inputs = xs
    if not grad:

        def run():
            with torch.no_grad():
                return forward()

        return run
    do = torch.randn(B, T, H, D, dtype=dtype, device=device)

    def run_bwd():
        o = forward()
        grads = torch.autograd.grad(o, inputs, grad_outputs=do.reshape(o.shape))
        return grads

    return run_bwd


def timings(device: str, smoke: bool, deadline: float) -> list[dict]:
    B, H, D = (1, 2, 16) if smoke else (1, 16, 64)
    lengths = [128, 256] if smoke else [1024, 2048, 4096, 8192, 16384]
    records = []
    for dtype_name in ("bfloat16", "float32"):
        dtype = getattr(torch, dtype_name)
        for mode in ("fwd", "fwdbwd"):
            seq_ok = True
            for T in lengths:
                for op in ("torch_chunked", "torch", "sdpa"):
                    if op == "torch" and not seq_ok:
                        continue
                    if time.time() > deadline:
                        log(f"  time budget spent: skipping {op} {dtype_name} {mode} T={T}")
                        continue
                    fn = make_op(op, mode, B, T, H, D, dtype, device)
                    if op == "torch":
                        # One call, timed; do_bench needs at least ~8 more calls.
                        start = time.perf_counter()
                        fn()
                        if device == "cuda":
                            torch.cuda.synchronize()
                        one = time.perf_counter() - start
                        if 10 * one > SEQ_BUDGET_S:
                            seq_ok = False
                            log(f"  torch sequential {mode} T={T}: {one:.1f} s per call, skipped")
                            continue
                    ms = bench(fn, device, smoke)
                    records.append(
                        {
                            "op": op,
                            "B": B,
                            "T": T,
                            "H": H,
                            "D": D,
                            "dtype": dtype_name,
                            "mode": mode,
                            "median_ms": ms,
                        }
                    )
                    log(f"  {op:14s} {dtype_name:9s} {mode:7s} T={T:6d}  {ms:10.3f} ms")
                    del fn
                    if device == "cuda":
                        torch.cuda.empty_cache()
    return records


def table(records: list[dict]) -> str:
    by = {(r["dtype"], r["mode"], r["T"], r["op"]): r["median_ms"] for r in records}
    keys = sorted({(r["dtype"], r["mode"], r["T"]) for r in records})
    lines = [
        f"{'dtype':9s} {'mode':7s} {'T':>6s} {'chunked ms':>11s} {'seq ms':>10s} {'sdpa ms':>9s} "
        f"{'seq/chk':>8s} {'chk/sdpa':>9s}"
    ]
    for d, m, T in keys:
        c, s, a = (by.get((d, m, T, op)) for op in ("torch_chunked", "torch", "sdpa"))

        def f(x, w):
            return f"{x:{w}.3f}" if x is not None else " " * (w - 1) + "-"

        lines.append(
            f"{d:9s} {m:7s} {T:6d} {f(c, 11)} {f(s, 10)} {f(a, 9)} "
            f"{f(s / c if s and c else None, 8)} {f(c / a if c and a else None, 9)}"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on CPU (tests the script)")
    parser.add_argument("--budget-s", type=float, default=200.0, help="stop timing after this")
    args = parser.parse_args()
    device = "cpu" if args.smoke or not torch.cuda.is_available() else "cuda"
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 (anchors.md A.3)
        torch.backends.cudnn.allow_tf32 = False
    out = Path(os.environ.get("OUT", "."))
    out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    log(f"device {device}; correctness first")
    checks = correctness(device, args.smoke)
    failed = [c for c in checks if not c["passed"]]
    for c in checks:
        log(
            f"  {c['backend']:14s} {c['dtype']:9s} {c['output']}: error/budget "
            f"{c['error_over_budget']:.3g} {'ok' if c['passed'] else 'FAILED'}"
        )
    result = {"machine": machine(device), "correctness": checks, "records": []}
    if failed:
        log("correctness FAILED: no timings are reported")
        (out / "torch_h200.json").write_text(json.dumps(result, indent=1))
        return 1
    log(f"correctness passed in {time.time() - start:.1f} s; timings")
    result["records"] = timings(device, args.smoke, deadline=start + args.budget_s)
    (out / "torch_h200.json").write_text(json.dumps(result, indent=1))
    log(f"wrote {out / 'torch_h200.json'} after {time.time() - start:.1f} s")
    log(table(result["records"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
