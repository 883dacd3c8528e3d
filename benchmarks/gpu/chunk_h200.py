"""The chunked kernel on the H200: correctness first, then medians side by side (chunk.json).

Correctness: ``validate`` of the registry backend ``triton_chunked`` in bf16 and fp32 for the
paper and exact presets at dk up to 64 and 128; a long sequence against the float64 oracle
(T = 16384 and 65536, a few heads); the penalty chain in float64 and float32 against the
oracle on the ``concentrated`` penalties of the strategies; gradients against torch_chunked in
float64.  Then ``triton.testing.do_bench`` medians, B = 1, H = 16, bf16, paper preset, D = 64
and 128, T ∈ {1k, 4k, 16k, 64k}: ``vla_triton_chunked``, ``vla_triton_fused``,
``fla_chunk_delta``, ``fla_chunk_dplr``, ``sdpa`` (records as in ``fused.json``); the kernel
breakdown of the chunked forward (torch.profiler); penalty-chain variants; the overhead of
:func:`vla_verify.ops.vla` at T = 1024.

Usage: ``python benchmarks/gpu/chunk_h200.py --out DIR --commit SHA [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def _log(*a: Any) -> None:
    print(*a, flush=True)


def correctness(out: dict[str, Any], quick: bool) -> None:
    import numpy as np
    import torch

    from vla_verify import VLAConfig, backends, validate
    from vla_verify.backends.numpy_oracle import recurrence
    from vla_verify.backends.torch_chunked import chunked
    from vla_verify.backends.triton_chunked import chunked_vla
    from vla_verify.bench import _inputs
    from vla_verify.error_model import compare
    from vla_verify.properties.strategies import ShapeBounds, make_penalties

    res = out["correctness"]
    be = backends.get("triton_chunked")
    for dtype in ("bfloat16", "float32"):
        for name, config in (("paper", VLAConfig()), ("exact", VLAConfig.exact())):
            for dk in (64, 128):
                t0 = time.time()
                try:
                    rep = validate(
                        be, config=config, array="torch", dtype=dtype, device="cuda",
                        max_examples=3 if quick else 6, seed=dk,
                        bounds=ShapeBounds(max_B=1, max_H=2, max_T=200, max_dk=dk, max_dv=dk),
                    )  # fmt: skip
                    res[f"validate_{dtype}_{name}_dk{dk}"] = {
                        "passed": rep.passed, "examples": rep.examples,
                        "worst_ratio": rep.worst_ratio, "seconds": round(time.time() - t0, 1),
                        "summary": rep.summary() if not rep.passed else "",
                    }  # fmt: skip
                except Exception as exc:
                    res[f"validate_{dtype}_{name}_dk{dk}"] = {"error": repr(exc)}
                _log("validate", dtype, name, dk, res[f"validate_{dtype}_{name}_dk{dk}"])

    def long_check(T: int, dk: int, H: int, penalty_dtype: str = "float64") -> dict[str, Any]:
        x = _inputs(1, T, H, dk, torch.float32, "cuda", seed=T)
        args = [x[n] for n in "qkvu"]
        cfg = VLAConfig()
        o, st = chunked_vla(*args, config=cfg, penalty_dtype=penalty_dtype)
        seen = [a.double().cpu().numpy() for a in args]
        ref = recurrence(*seen, config=cfg)
        base = recurrence(*seen, config=cfg, dtype="float32")
        got = dict(zip("oSAz", (o, *st), strict=True))
        refs = dict(zip("oSAz", (ref.o, *ref.state), strict=True))
        bases = dict(zip("oSAz", (base.o, *base.state), strict=True))
        r: dict[str, Any] = {}
        for key, val in got.items():
            scale = 1 / cfg.lambda0 if key == "A" else None
            c = compare(
                key, val.double().cpu().numpy(), refs[key], bases[key], "float32",
                terms=dk + 64, scale=None if scale is None else np.full((1, H), scale),
            )  # fmt: skip
            r[key] = {"ratio": c.ratio, "max_err": float(np.max(c.error))}
        r["passed"] = all(v["ratio"] <= 1 for v in r.values() if isinstance(v, dict))
        return r

    for T in (16384,) if quick else (16384, 65536):
        t0 = time.time()
        try:
            res[f"long_T{T}_dk64_H2"] = long_check(T, 64, 2)
        except Exception as exc:
            res[f"long_T{T}_dk64_H2"] = {"error": repr(exc), "tb": traceback.format_exc()}
        res[f"long_T{T}_dk64_H2"]["seconds"] = round(time.time() - t0, 1)
        _log("long", T, res[f"long_T{T}_dk64_H2"])

    # The penalty chain's precision on concentrated penalties (strategies), T = 256, dk = 64.
    rng = np.random.default_rng(0)
    for regime in ("concentrated", "layer"):
        B, T, H, dk = 1, 256, 4, 64
        k_raw = rng.standard_normal((B, T, H, dk))
        u = make_penalties(rng, regime, (B, T, H, dk), k_raw)
        q = np.exp(0.5 * rng.standard_normal((B, T, H, dk)))
        k = np.exp(0.5 * k_raw)
        v = rng.standard_normal((B, T, H, dk))
        cfg = VLAConfig()
        t = [torch.tensor(a, dtype=torch.float32, device="cuda") for a in (q, k, v, u)]
        seen = [a.double().cpu().numpy() for a in t]
        ref = recurrence(*seen, config=cfg)
        base = recurrence(*seen, config=cfg, dtype="float32")
        for pd in ("float64", "float32"):
            try:
                o, st = chunked_vla(*t, config=cfg, penalty_dtype=pd)
                entry = {}
                for key, val, r, b in (
                    ("o", o, ref.o, base.o),
                    ("A", st[1], ref.state[1], base.state[1]),
                    ("S", st[0], ref.state[0], base.state[0]),
                ):
                    c = compare(
                        key,
                        val.double().cpu().numpy(),
                        r,
                        b,
                        "float32",
                        terms=dk + 64,
                        scale=np.full((B, H), 1 / cfg.lambda0) if key == "A" else None,
                    )
                    entry[key] = c.ratio
                res[f"penalty_{pd}_{regime}"] = entry
            except Exception as exc:
                res[f"penalty_{pd}_{regime}"] = {"error": repr(exc)}
            _log("penalty", pd, regime, res[f"penalty_{pd}_{regime}"])

    # Gradients (the backward recomputes through torch_chunked) against torch_chunked float64.
    try:
        x = _inputs(1, 200, 2, 64, torch.float32, "cuda", seed=1)
        cfg = VLAConfig()

        def grads(fn: Any, dtype: Any) -> list[Any]:
            xs = [x[n].to(dtype).detach().requires_grad_(True) for n in "qkvu"]
            o, (S, A, _) = fn(*xs)
            ((o * o).sum() + S.sum() + A.sum()).backward()
            return [a.grad.double() for a in xs]

        ref = grads(lambda *a: chunked(*a, config=cfg, penalty_chain="woodbury"), torch.float64)
        base = grads(lambda *a: chunked(*a, config=cfg), torch.float32)
        got = grads(lambda *a: chunked_vla(*a, config=cfg), torch.float32)
        ratios = {}
        for n, g, r, b in zip("qkvu", got, ref, base, strict=True):
            budget = 2 * float((b - r).abs().max()) + 2 * 66 * 6e-8 * float(r.abs().max())
            ratios[n] = float((g - r).abs().max()) / budget
        res["grad_T200_dk64"] = {"ratio": ratios, "passed": max(ratios.values()) <= 1}
    except Exception as exc:
        res["grad_T200_dk64"] = {"error": repr(exc)}
    _log("grad", res["grad_T200_dk64"])


def _grid_fns(x: dict[str, Any], cfg: Any, T: int, D: int) -> dict[str, Any]:
    """The forward of every op of the grid on the inputs ``x`` (vla_verify.bench._inputs)."""
    import torch
    import torch.nn.functional as F

    from vla_verify.backends.triton_chunked import chunked_vla
    from vla_verify.backends.triton_fused import fused_recurrent_vla

    q, k, v, u = (x[n] for n in "qkvu")
    qu, ku = x["q_unit"], x["k_unit"]
    beta = torch.ones(1, T, 16, device="cuda", dtype=torch.bfloat16)
    gk = torch.zeros(1, T, 16, D, device="cuda", dtype=torch.float32)
    qh, kh, vh = (a.transpose(1, 2).contiguous() for a in (q, k, v))
    fns: dict[str, Any] = {
        "vla_triton_chunked": lambda: chunked_vla(q, k, v, u, config=cfg)[0],
        "vla_triton_fused": lambda: fused_recurrent_vla(q, k, v, u, config=cfg)[0],
        "sdpa": lambda: F.scaled_dot_product_attention(qh, kh, vh, is_causal=True),
    }
    try:
        from fla.ops.delta_rule import chunk_delta_rule
        from fla.ops.generalized_delta_rule import chunk_dplr_delta_rule
    except Exception as exc:  # fla missing on the machine: those rows are absent
        _log("fla missing", exc)
        return fns
    fns["fla_chunk_delta"] = lambda: chunk_delta_rule(qu, ku, v, beta, scale=1.0)[0]
    fns["fla_chunk_dplr"] = lambda: chunk_dplr_delta_rule(qu, ku, v, -ku, ku, gk, scale=1.0)[0]
    return fns


def _variant(x: dict[str, Any], cfg: Any, pc: int, pd: str) -> Any:
    from vla_verify.backends.triton_chunked import chunked_vla

    q, k, v, u = (x[n] for n in "qkvu")
    return lambda: chunked_vla(q, k, v, u, config=cfg, penalty_chunk=pc, penalty_dtype=pd)[0]


def timing(out: dict[str, Any], quick: bool) -> None:
    import torch

    from vla_verify import VLAConfig, backends, ops
    from vla_verify.backends.triton_chunked import chunked_vla
    from vla_verify.backends.triton_fused import fused_recurrent_vla
    from vla_verify.bench import _inputs, time_ms

    cfg = VLAConfig()
    recs = out["records"]
    Ts = (1024, 4096, 16384) if quick else (1024, 4096, 16384, 65536)
    for D in (64, 128):
        for T in Ts:
            x = _inputs(1, T, 16, D, torch.bfloat16, "cuda")
            fns = _grid_fns(x, cfg, T, D)
            for op, fn in fns.items():
                try:
                    ms = time_ms(fn)
                except Exception as exc:
                    _log("timing failed", op, D, T, repr(exc))
                    continue
                rec = {"op": op, "B": 1, "T": T, "H": 16, "D": D, "dtype": "bfloat16",
                       "mode": "fwd", "median_ms": ms}  # fmt: skip
                recs.append(rec)
                _log(rec)
            del x, fns
            torch.cuda.empty_cache()

    # Variants and the breakdown at T = 4096 (and 16384 for the breakdown).
    var = out["variants"]
    for D in (64, 128):
        x = _inputs(1, 4096, 16, D, torch.bfloat16, "cuda")
        q, k, v, u = (x[n] for n in "qkvu")
        for pc in (16, 32, 64):
            for pd in ("float64", "float32"):
                try:
                    ms = time_ms(_variant(x, cfg, pc, pd))
                    var.append({"D": D, "T": 4096, "penalty_chunk": pc, "penalty_dtype": pd,
                                "median_ms": ms})  # fmt: skip
                    _log(var[-1])
                except Exception as exc:
                    _log("variant failed", D, pc, pd, repr(exc))
        try:
            from torch.profiler import ProfilerActivity, profile

            chunked_vla(q, k, v, u, config=cfg)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    chunked_vla(q, k, v, u, config=cfg)
                torch.cuda.synchronize()
            kern = {}
            for e in prof.key_averages():
                if e.device_type.name == "CUDA" or "kernel" in e.key:
                    kern[e.key] = getattr(e, "device_time_total", 0.0) / 5 / 1e3
            out["breakdown"][f"D{D}_T4096_ms"] = kern
            _log("breakdown", D, kern)
        except Exception as exc:
            _log("breakdown failed", repr(exc))

    # The entry point's overhead at T = 1024, D = 64 (it dispatches to the recurrent kernel).
    x = _inputs(1, 1024, 16, 64, torch.bfloat16, "cuda")
    q, k, v, u = (x[n] for n in "qkvu")
    reg = backends.get("triton_fused")
    ov: dict[str, Any] = {}
    for name, fn in (
        ("fused_direct", lambda: fused_recurrent_vla(q, k, v, u, config=cfg)[0]),
        ("ops_vla", lambda: ops.vla(q, k, v, u, config=cfg)[0]),
        ("registry_triton_fused", lambda: reg(q, k, v, u, config=cfg)[0]),
        ("fused_direct_again", lambda: fused_recurrent_vla(q, k, v, u, config=cfg)[0]),
    ):
        ov[name] = time_ms(fn)
        # Host time per call (what do_bench's GPU events can hide when the GPU is the bound).
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        ov[name + "_wall_ms"] = (time.perf_counter() - t0) / 50 * 1e3
    out["ops_overhead_T1024_D64"] = ov
    _log("overhead", ov)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--skip-correctness", action="store_true")
    a = ap.parse_args()
    from vla_verify.bench import machine_info

    out: dict[str, Any] = {"machine": {**machine_info(), "commit": a.commit}, "records": [],
                           "correctness": {}, "variants": [], "breakdown": {}}  # fmt: skip
    path = Path(a.out) / "chunk.json"
    t0 = time.time()
    try:
        if not a.skip_correctness:
            correctness(out, a.quick)
        out["correctness_seconds"] = round(time.time() - t0, 1)
        path.write_text(json.dumps(out, indent=1))
        timing(out, a.quick)
    except Exception:
        out["error"] = traceback.format_exc()
        _log(out["error"])
    out["seconds"] = round(time.time() - t0, 1)
    path.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
