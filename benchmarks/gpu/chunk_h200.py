"""The chunked kernel on the H200: correctness first, then medians side by side (chunk.json).

Correctness: ``validate`` of the registry backend ``triton_chunked`` in bf16 and fp32 for the
paper and exact presets at dk up to 64 and 128; a long sequence against the float64 oracle
(T = 16384 and 65536, a few heads); the penalty chain in float64 and float32 against the
oracle on the ``concentrated`` penalties of the strategies; gradients against torch_chunked in
float64.  Then ``triton.testing.do_bench`` medians, B = 1, H = 16, bf16, paper preset, D = 64
and 128, T ∈ {1k, 4k, 16k, 64k}: ``vla_triton_chunked``, ``vla_triton_fused``,
``fla_chunk_delta``, ``fla_chunk_dplr``, ``sdpa`` (records as in ``fused.json``); the kernel
breakdown of the chunked forward (torch.profiler); penalty-chain variants; the overhead of
:func:`vla_verify.ops.vla` at T = 1024.  ``--adjoint``: only the adjoint in blocks against
one pass and with the state adjoint in chunks (:func:`adjoint`, into the same file under
``"adjoint"``).

Usage: ``python benchmarks/gpu/chunk_h200.py --out DIR --commit SHA [--quick]``;
``TRITON_INTERPRET=1 python benchmarks/gpu/chunk_h200.py --out DIR --smoke`` runs every step on
the CPU at toy sizes (a test of the script, not a measurement).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


#: Sizes of each step; ``--smoke`` replaces them with toy ones on the CPU.
RUN: dict[str, Any] = {
    "device": "cuda",
    "smoke": False,
    "validate_dks": (64, 128),
    "validate_T": 200,
    "long_Ts": (16384, 65536),
    "long_dk": 64,
    "penalty_shape": (1, 256, 4, 64),
    "grad_shape": (1, 200, 2, 64),
    "grid_Ds": (64, 128),
    "grid_Ts": (1024, 4096, 16384, 65536),
    # Lengths added at D = 64 (forward and forward + backward), where the chunked forward
    # meets causal SDPA: claim C9's verdict needs the crossing bracketed inside [21500, 86000]
    # (20480 and 24576 place a crossing below 32768 against the window's lower end).
    "c9_Ts": (20480, 24576, 32768, 49152),
    "grid_H": 16,
    "variant_T": 16384,
    "variant_Ds": (64, 128),
    "variant_blocks": (None, 256, 512, 1024, 2048),
    "long_variant_T": 65536,
    "long_variant_blocks": (None, 512, 1024, 2048, 4096),
    # Host traces of the forward (--host-trace).
    "trace_Ts": (4096, 16384),
    # The read-out's value columns per program (--readout-variants).
    "readout_Ts": (4096, 16384, 65536),
    "readout_blocks": (32, 64, 128),
    # Penalty-chain blocks at short lengths (--block-variants).
    "block_variant_Ts": (1024, 4096),
    "block_variant_blocks": (None, 128, 256, 512),
    # The longest forward + backward of the chunked kernel timed (its backward is the
    # recurrent kernel's adjoint from the chunked forward's checkpoints).
    "fwdbwd_chunked_max_T": 65536,
    "overhead_T": 1024,
    # The blocked adjoint against one pass: gradients at adjoint_check, times at adjoint_sizes.
    "adjoint_check": (64, 4096),
    "adjoint_sizes": ((64, 4096), (64, 16384), (128, 16384)),
}
SMOKE = {
    "device": "cpu",
    "smoke": True,
    "validate_dks": (8,),
    "validate_T": 30,
    "long_Ts": (150,),
    "long_dk": 8,
    "penalty_shape": (1, 40, 2, 8),
    "grad_shape": (1, 20, 1, 8),
    "grid_Ds": (16,),
    "grid_Ts": (64,),
    "c9_Ts": (),
    "grid_H": 2,
    "variant_T": 64,
    "variant_Ds": (16,),
    "variant_blocks": (None, 32),
    "long_variant_T": 64,
    "long_variant_blocks": (16,),
    "trace_Ts": (64,),
    "readout_Ts": (64,),
    "readout_blocks": (16, 32),
    "block_variant_Ts": (64,),
    "block_variant_blocks": (None, 16, 32),
    "fwdbwd_chunked_max_T": 64,
    "overhead_T": 64,
    "adjoint_check": (16, 70),
    "adjoint_sizes": ((16, 64),),
}


def _log(*a: Any) -> None:
    print(*a, flush=True)


def correctness(out: dict[str, Any], quick: bool) -> None:
    import numpy as np
    import torch

    from vla_verify import VLAConfig, backends, validate
    from vla_verify.backends.numpy_oracle import recurrence
    from vla_verify.backends.triton_chunked import chunked_vla
    from vla_verify.bench import _inputs
    from vla_verify.error_model import compare
    from vla_verify.properties.strategies import ShapeBounds, make_penalties

    res = out["correctness"]
    be = backends.get("triton_chunked")
    plan = [
        (dtype, name, config, dk)
        for dtype in ("bfloat16", "float32")
        for name, config in (("paper", VLAConfig()), ("exact", VLAConfig.exact()))
        for dk in RUN["validate_dks"]
    ]
    if quick:  # the paper preset at both widths in both dtypes, the exact one in fp32 at 128
        plan = [p for p in plan if p[1] == "paper" or (p[0] == "float32" and p[3] == max(
            RUN["validate_dks"]))]  # fmt: skip
    for dtype, name, config, dk in plan:
        t0 = time.time()
        try:
            # The checker's default reach (lengths to 640 at tile and chunk boundaries, B·H
            # to 6) with dk and dv at the width itself: a few examples of the default mix up
            # to dk seldom reach it (docs/checker.md); the smoke run keeps toy sizes.
            reach: dict[str, Any] = (
                {"bounds": ShapeBounds(max_B=1, max_H=2, max_T=RUN["validate_T"], max_dk=dk,
                                       max_dv=dk)}
                if RUN["smoke"] else {"head_dims": (dk,)}
            )  # fmt: skip
            rep = validate(
                be, config=config, array="torch", dtype=dtype, device=RUN["device"],
                max_examples=1 if RUN["smoke"] else 2 if quick else 6, seed=dk, **reach,
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
        x = _inputs(1, T, H, dk, torch.float32, RUN["device"], seed=T)
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

    for T in RUN["long_Ts"][:1] if quick else RUN["long_Ts"]:
        t0 = time.time()
        key = f"long_T{T}_dk{RUN['long_dk']}_H2"
        try:
            res[key] = long_check(T, RUN["long_dk"], 2)
        except Exception as exc:
            res[key] = {"error": repr(exc), "tb": traceback.format_exc()}
        res[key]["seconds"] = round(time.time() - t0, 1)
        _log("long", T, res[key])

    # The penalty chain's precision on concentrated penalties (strategies), T = 256, dk = 64.
    rng = np.random.default_rng(0)
    for regime in ("concentrated", "gaussian", "layer"):
        B, T, H, dk = RUN["penalty_shape"]
        k_raw = rng.standard_normal((B, T, H, dk))
        u = make_penalties(rng, regime, (B, T, H, dk), k_raw)
        q = np.exp(0.5 * rng.standard_normal((B, T, H, dk)))
        k = np.exp(0.5 * k_raw)
        v = rng.standard_normal((B, T, H, dk))
        cfg = VLAConfig()
        t = [torch.tensor(a, dtype=torch.float32, device=RUN["device"]) for a in (q, k, v, u)]
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

    grad_check(res, RUN["grad_shape"], "grad")


def grad_check(res: dict[str, Any], shape: tuple[int, int, int, int], key: str) -> None:
    """Gradients (the recurrent kernel's adjoint, which the chunked backend runs) against
    torch_chunked float64 at ``shape`` ``(B, T, H, dk)``, spec §4 budget with err_p from
    torch_chunked in float32 on the inputs and seven copies moved by one ulp; into
    ``res[key]``."""
    import numpy as np
    import torch

    from vla_verify import VLAConfig
    from vla_verify.backends.torch_chunked import chunked
    from vla_verify.backends.triton_chunked import chunked_vla
    from vla_verify.bench import _inputs
    from vla_verify.gradient_check import check_gradients

    try:
        B, T, H, dk = shape
        x = _inputs(B, T, H, dk, torch.float32, RUN["device"], seed=1)
        cfg = VLAConfig()
        rng = np.random.default_rng(1)
        arrays = [x[n].double().cpu().numpy() for n in "qkvu"] + [
            np.zeros((B, H, dk, dk)),
            np.broadcast_to(np.eye(dk) / cfg.lambda0, (B, H, dk, dk)).copy(),
            np.zeros((B, H, dk)),
        ]
        cot = [rng.standard_normal(a.shape) for a in (arrays[2], arrays[4], arrays[5], arrays[6])]

        def woodbury(*a: Any, **kw: Any) -> Any:
            return chunked(*a, penalty_chain="woodbury", **kw)

        checks = check_gradients(
            chunked_vla, woodbury, arrays, cot, config=cfg, dtype="float32",
            device=RUN["device"], baselines=[chunked], terms=dk,
        )  # fmt: skip
        ratios = {n: c.ratio for n, c in checks.items()}
        res[key] = {"shape": [B, T, H, dk], "ratio": ratios, "passed": max(ratios.values()) <= 1}
    except Exception as exc:
        res[key] = {"error": repr(exc)}
    _log("grad", res[key])


def _penalty_dtype(x: dict[str, Any], cfg: Any) -> str:
    """The penalty chain's precision this run times: ``"auto"`` (the default: float32 in the
    bf16 inference forward, float64 in training) if its kernels build here, else float32
    (recorded with each record: the float64 kernel once failed to compile on the H200 with
    Triton 3.6)."""
    from vla_verify.backends.triton_chunked import chunked_vla

    key = ("penalty_dtype", x["q"].shape[-1])
    if key not in RUN:
        try:
            leaves = [x[n].detach().clone().requires_grad_(True) for n in "qkvu"]
            chunked_vla(*(x[n] for n in "qkvu"), config=cfg)  # the inference forward's chain
            chunked_vla(*leaves, config=cfg)  # training's
            RUN[key] = "auto"
        except Exception as exc:
            _log("the default penalty chains failed, timing float32:", repr(exc)[:300])
            RUN[key] = "float32"
    return str(RUN[key])


def _grid_fns(x: dict[str, Any], cfg: Any, T: int, D: int) -> dict[str, Any]:
    """The forward of every op of the grid on the inputs ``x`` (vla_verify.bench._inputs)."""
    import torch
    import torch.nn.functional as F

    from vla_verify.backends.triton_chunked import chunked_vla
    from vla_verify.backends.triton_fused import fused_recurrent_vla

    q, k, v, u = (x[n] for n in "qkvu")
    pd = _penalty_dtype(x, cfg)
    qu, ku = x["q_unit"], x["k_unit"]
    H = q.shape[2]
    beta = torch.ones(1, T, H, device=q.device, dtype=q.dtype)
    gk = torch.zeros(1, T, H, D, device=q.device, dtype=torch.float32)
    qh, kh, vh = (a.transpose(1, 2).contiguous() for a in (q, k, v))
    fns: dict[str, Any] = {
        "vla_triton_chunked": lambda: chunked_vla(q, k, v, u, config=cfg, penalty_dtype=pd)[0],
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


def _grid_fwdbwd_fns(x: dict[str, Any], cfg: Any, T: int, D: int) -> dict[str, Any]:
    """Forward and backward (``torch.autograd.grad`` of ``o`` against the cotangent ``do``) of
    every op of the grid; the chunked kernel only up to ``fwdbwd_chunked_max_T``."""
    import torch
    import torch.nn.functional as F

    from vla_verify.backends.triton_chunked import chunked_vla
    from vla_verify.backends.triton_fused import fused_recurrent_vla
    from vla_verify.bench import _grad_op

    def leaves(*names: str) -> list[Any]:
        return [x[n].detach().clone().requires_grad_(True) for n in names]

    do = x["do"]
    H = do.shape[2]
    pd = _penalty_dtype(x, cfg)
    beta = torch.ones(1, T, H, device=do.device, dtype=do.dtype)
    gk = torch.zeros(1, T, H, D, device=do.device, dtype=torch.float32)
    fns: dict[str, Any] = {}
    if T <= RUN["fwdbwd_chunked_max_T"]:
        fns["vla_triton_chunked"] = _grad_op(
            lambda q, k, v, u: chunked_vla(q, k, v, u, config=cfg, penalty_dtype=pd)[0],
            leaves("q", "k", "v", "u"), do,
        )  # fmt: skip
    fns["vla_triton_fused"] = _grad_op(
        lambda q, k, v, u: fused_recurrent_vla(q, k, v, u, config=cfg)[0],
        leaves("q", "k", "v", "u"), do,
    )  # fmt: skip
    fns["sdpa"] = _grad_op(
        lambda q, k, v: F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        ).transpose(1, 2),
        leaves("q", "k", "v"), do,
    )  # fmt: skip
    try:
        from fla.ops.delta_rule import chunk_delta_rule
        from fla.ops.generalized_delta_rule import chunk_dplr_delta_rule
    except Exception:  # fla missing on the machine: those rows are absent
        return fns
    fns["fla_chunk_delta"] = _grad_op(
        lambda q, k, v: chunk_delta_rule(q, k, v, beta, scale=1.0)[0],
        leaves("q_unit", "k_unit", "v"), do,
    )  # fmt: skip
    fns["fla_chunk_dplr"] = _grad_op(
        lambda q, k, v: chunk_dplr_delta_rule(q, k, v, -k, k, gk, scale=1.0)[0],
        leaves("q_unit", "k_unit", "v"), do,
    )  # fmt: skip
    return fns


def _variant(x: dict[str, Any], cfg: Any, block: int | None) -> Any:
    from vla_verify.backends.triton_chunked import chunked_vla

    q, k, v, u = (x[n] for n in "qkvu")
    return lambda: chunked_vla(q, k, v, u, config=cfg, penalty_block=block)[0]


def resumed(previous: dict[str, Any], machine: dict[str, Any]) -> dict[str, Any]:
    """A cut grid to go on from: its correctness where all of it ran, and its records of every
    (D, T, mode) row whose ops were all timed (a row's ops are timed side by side, so a partial
    row is timed again whole); the rest as a new run's.  Where this machine is not the one
    that measured them, both machine records are kept, the new one as ``machine_resumed``.  A
    grid is of one commit: resuming at another is refused."""
    if machine.get("commit") != previous["machine"].get("commit"):
        raise SystemExit(
            f"--resume: the grid was measured at commit {previous['machine'].get('commit')!r}, "
            f"this run is {machine.get('commit')!r}; a grid is of one commit"
        )
    rows: dict[tuple[int, int, str], list[dict[str, Any]]] = {}
    for r in previous["records"]:
        rows.setdefault((r["D"], r["T"], r["mode"]), []).append(r)
    ops = {r["op"] for r in previous["records"]}
    kept = [r for row in rows.values() if {r["op"] for r in row} == ops for r in row]
    out = {"machine": previous["machine"], "records": kept, "variants": [], "breakdown": {},
           "correctness": {}}  # fmt: skip
    if "correctness_seconds" in previous:  # the correctness steps all ran
        out["correctness"] = previous["correctness"]
        out["correctness_seconds"] = previous["correctness_seconds"]
    if {k: v for k, v in machine.items() if k != "commit"} != {
        k: v for k, v in previous["machine"].items() if k != "commit"
    }:
        out["machine_resumed"] = machine
    return out


def _timed(recs: list[dict[str, Any]], D: int, T: int, mode: str) -> bool:
    """Whether the records hold row (D, T, mode) already (a resumed grid's)."""
    return any((r["D"], r["T"], r["mode"]) == (D, T, mode) for r in recs)


def timing(out: dict[str, Any], quick: bool) -> None:
    import torch

    from vla_verify import VLAConfig
    from vla_verify.backends.triton_chunked import (
        BLOCK_START_FALLBACKS,
        penalty_block_length,
    )
    from vla_verify.bench import _inputs, time_ms

    cfg = VLAConfig()
    recs = out["records"]
    Ts = RUN["grid_Ts"][:3] if quick else RUN["grid_Ts"]
    H, dev, smoke = RUN["grid_H"], RUN["device"], RUN["smoke"]
    dt = torch.float32 if smoke else torch.bfloat16  # the interpreter's bf16 tl.dot is wrong
    for D in RUN["grid_Ds"]:
        extra = RUN["c9_Ts"] if D == 64 and not quick else ()
        for T in sorted({*Ts, *extra}):
            if _timed(recs, D, T, "fwd") and _timed(recs, D, T, "fwdbwd"):
                continue
            x = _inputs(1, T, H, D, dt, dev)
            fns = {}
            for mode, make in (("fwd", _grid_fns), ("fwdbwd", _grid_fwdbwd_fns)):
                if _timed(recs, D, T, mode):
                    continue
                fns = make(x, cfg, T, D)
                for op, fn in fns.items():
                    before = BLOCK_START_FALLBACKS[0]
                    try:
                        ms = time_ms(fn, device=dev)
                    except Exception as exc:
                        _log("timing failed", op, mode, D, T, repr(exc)[:400])
                        continue
                    rec = {"op": op, "B": 1, "T": T, "H": H, "D": D, "dtype": str(dt)[6:],
                           "mode": mode, "median_ms": ms}  # fmt: skip
                    if op == "vla_triton_chunked":
                        rec["penalty_dtype"] = _penalty_dtype(x, cfg)
                        auto32 = mode == "fwd" and dt == torch.bfloat16
                        chain = ("float32" if auto32 or rec["penalty_dtype"] == "float32"
                                 else "float64")  # fmt: skip
                        rec["block_tokens"] = penalty_block_length(
                            T, 16, dk=D, heads=H, device=dev, chain_dtype=chain
                        )  # the chain "auto" takes (chunked_vla's penalty_dtype)
                        rec["block_start_fallbacks"] = BLOCK_START_FALLBACKS[0] - before
                    if mode == "fwd" and RUN.get("graphs") and not smoke:
                        from forward_graph import eager_and_replayed

                        # The eager median again, beside the replay's, in one measurement.
                        rec.update(eager_and_replayed(fn))
                    recs.append(rec)
                    _log(rec)
                    if RUN.get("path"):  # keep what is measured if the run is cut short
                        RUN["path"].write_text(json.dumps(out, indent=1))
            del x, fns
            torch.cuda.empty_cache()

    # Penalty-chain blocks (the default, and fixed lengths; one block of T tokens is the chain
    # in one pass) and the kernel breakdown at variant_T; the default and longer blocks at
    # long_variant_T for the first width.
    var = out["variants"]
    VT = RUN["variant_T"]
    for D in RUN["variant_Ds"]:
        plans = [(VT, (*RUN["variant_blocks"], 16 * -(-VT // 16)))]
        if D == RUN["variant_Ds"][0]:
            plans.append((RUN["long_variant_T"], RUN["long_variant_blocks"]))
        if RUN.get("no_block_variants"):
            plans = []
        for T, blocks in plans:
            x = _inputs(1, T, H, D, dt, dev)
            for block in blocks:
                before = BLOCK_START_FALLBACKS[0]
                try:
                    ms = time_ms(_variant(x, cfg, block), device=dev)
                    fallbacks = BLOCK_START_FALLBACKS[0] - before
                    # The forward's chain: float32 for bf16 inputs ("auto"), else float64.
                    chain = "float32" if dt == torch.bfloat16 else "float64"
                    tokens = penalty_block_length(T, 16, block, dk=D, heads=H, device=dev,
                                                  chain_dtype=chain)  # fmt: skip
                    var.append({"D": D, "T": T, "penalty_block": block, "block_tokens": tokens,
                                "median_ms": ms, "block_start_fallbacks": fallbacks})  # fmt: skip
                    _log(var[-1])
                except Exception as exc:
                    _log("variant failed", D, T, block, repr(exc)[:400])
                if RUN.get("path"):
                    RUN["path"].write_text(json.dumps(out, indent=1))
        _forward_breakdown(out, _inputs(1, VT, H, D, dt, dev), cfg, D, VT)

    overhead(out)


def _forward_breakdown(out: dict[str, Any], x: dict[str, Any], cfg: Any, D: int, T: int) -> None:
    """Device time per kernel of the chunked forward with the default plan (torch.profiler,
    mean of 5 calls), into ``out["breakdown"]["D{D}_T{T}_ms"]``."""
    import torch

    from vla_verify.backends.triton_chunked import chunked_vla

    q, k, v, u = (x[n] for n in "qkvu")
    try:
        from torch.profiler import ProfilerActivity, profile

        if RUN["smoke"]:
            raise RuntimeError("no CUDA kernels to profile on the CPU")
        pd = _penalty_dtype(x, cfg)
        chunked_vla(q, k, v, u, config=cfg, penalty_dtype=pd)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                chunked_vla(q, k, v, u, config=cfg, penalty_dtype=pd)
            torch.cuda.synchronize()
        kern = {}
        for e in prof.key_averages():
            if e.device_type.name == "CUDA" or "kernel" in e.key:
                kern[e.key] = getattr(e, "device_time_total", 0.0) / 5 / 1e3
        out["breakdown"][f"D{D}_T{T}_ms"] = kern
        _log("breakdown", D, T, sorted(kern.items(), key=lambda kv: -kv[1])[:12])
    except Exception as exc:
        _log("breakdown failed", repr(exc))


def forward_breakdown(out: dict[str, Any]) -> None:
    """:func:`_forward_breakdown` at each of ``forward_breakdown_sizes``, alone."""
    import torch

    from vla_verify import VLAConfig
    from vla_verify.bench import _inputs

    for D, T in RUN["forward_breakdown_sizes"]:
        x = _inputs(1, T, RUN["grid_H"], D, torch.float32 if RUN["smoke"] else torch.bfloat16,
                    RUN["device"])  # fmt: skip
        _forward_breakdown(out, x, VLAConfig(), D, T)


def overhead(out: dict[str, Any]) -> None:
    """The entry point's overhead at T = 1024, D = 64 (it dispatches to the recurrent kernel),
    and the registry call's, beside the kernel called directly."""
    import torch

    from vla_verify import VLAConfig, backends, ops
    from vla_verify.backends.triton_fused import fused_recurrent_vla
    from vla_verify.bench import _inputs, time_ms

    cfg = VLAConfig()
    H, dev, smoke = RUN["grid_H"], RUN["device"], RUN["smoke"]
    dt = torch.float32 if smoke else torch.bfloat16
    # The entry point's overhead at T = 1024, D = 64 (it dispatches to the recurrent kernel).
    OT = RUN["overhead_T"]
    x = _inputs(1, OT, H, RUN["grid_Ds"][0], dt, dev)
    q, k, v, u = (x[n] for n in "qkvu")
    reg = backends.get("triton_fused")
    ov: dict[str, Any] = {}
    for name, fn in (
        ("fused_direct", lambda: fused_recurrent_vla(q, k, v, u, config=cfg)[0]),
        ("ops_vla", lambda: ops.vla(q, k, v, u, config=cfg)[0]),
        ("registry_triton_fused", lambda: reg(q, k, v, u, config=cfg)[0]),
        ("fused_direct_again", lambda: fused_recurrent_vla(q, k, v, u, config=cfg)[0]),
    ):
        ov[name] = time_ms(fn, device=dev)
        # Host time per call (what do_bench's GPU events can hide when the GPU is the bound).
        reps = 2 if smoke else 50
        if not smoke:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        if not smoke:
            torch.cuda.synchronize()
        ov[name + "_wall_ms"] = (time.perf_counter() - t0) / reps * 1e3
    out["ops_overhead"] = {"T": OT, "D": RUN["grid_Ds"][0], **ov}
    _log("overhead", ov)


def _crossing(a: dict[int, float], b: dict[int, float]) -> float | None:
    """The T from which op ``a`` is faster than op ``b`` at every longer measured T (medians by
    T), interpolated log-linearly between the last measured T where it is slower and the next;
    the smallest T if it is faster everywhere; ``None`` if it is slower at the longest T."""
    import math

    Ts = sorted(set(a) & set(b))
    gaps = [math.log(a[T]) - math.log(b[T]) for T in Ts]
    if not Ts or gaps[-1] >= 0:
        return None
    slower = [i for i, g in enumerate(gaps) if g >= 0]
    if not slower:
        return float(Ts[0])
    i = slower[-1]
    w = gaps[i] / (gaps[i] - gaps[i + 1])
    return float(math.exp(math.log(Ts[i]) + w * (math.log(Ts[i + 1]) - math.log(Ts[i]))))


def analyse(out: dict[str, Any], path: Path) -> None:
    """Fitted exponents (log ms against log T), the crossovers of the chunked forward with
    causal SDPA (C9's question) and with the recurrent kernel (``ops.FORWARD_CROSSOVER_T``),
    and a log-log plot of latency against T."""
    import numpy as np

    by: dict[tuple[str, int, str], dict[int, float]] = {}
    for r in out["records"]:
        by.setdefault((r["op"], r["D"], r["mode"]), {})[r["T"]] = r["median_ms"]
    fits = {}
    for (op, D, mode), series in by.items():
        Ts = sorted(series)
        if len(Ts) >= 2:
            slope = np.polyfit(np.log(Ts), np.log([series[T] for T in Ts]), 1)[0]
            fits[f"{op}_D{D}_{mode}"] = round(float(slope), 3)
    cross = {}
    for D in sorted({r["D"] for r in out["records"]}):
        for mode in ("fwd", "fwdbwd"):
            chunked = by.get(("vla_triton_chunked", D, mode), {})
            for other in ("sdpa", "vla_triton_fused", "fla_chunk_dplr"):
                ref = by.get((other, D, mode), {})
                if chunked and ref:
                    cross[f"{mode}_D{D}_chunked_beats_{other}_from_T"] = _crossing(chunked, ref)
    out["analysis"] = {"exponents": fits, "crossovers": cross}
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        modes = [m for m in ("fwd", "fwdbwd") if any(k[2] == m for k in by)]
        widths = sorted({d for (_, d, _) in by})
        fig, grid = plt.subplots(len(modes), len(widths), figsize=(5 * len(widths), 4 * len(modes)),
                                 squeeze=False)  # fmt: skip
        words = {"fwd": "forward", "fwdbwd": "forward + backward"}
        for row, mode in zip(grid, modes, strict=True):
            for ax, D in zip(row, widths, strict=True):
                for (op, d, m), series in sorted(by.items()):
                    if d == D and m == mode:
                        Ts = sorted(series)
                        slope = fits.get(f"{op}_D{D}_{mode}")
                        label = op if slope is None else f"{op} (∝ T^{slope:.2f})"
                        ax.loglog(Ts, [series[T] for T in Ts], "o-", label=label)
                ax.set_title(f"D = {D}, {words[mode]}, bf16, B = 1, H = 16")
                ax.set_xlabel("sequence length T (tokens)")
                ax.set_ylabel(f"{words[mode]} latency, median (ms)")
                ax.grid(True, which="both", alpha=0.3)
                ax.legend(fontsize=7)
        fig.tight_layout()
        # chunk.json's plot is chunk_latency.png, chunk_X.json's chunk_latency_X.png.
        fig.savefig(path.with_name(path.stem.replace("chunk", "chunk_latency", 1) + ".png"),
                    dpi=120)  # fmt: skip
    except Exception as exc:  # a plot is a convenience; the JSON holds the numbers
        _log("plot failed", repr(exc))


def compile_check(out: dict[str, Any]) -> None:
    """Each kernel configuration once, at a small shape, against the float64 oracle: key widths
    16–128, fp32 and bf16 inputs, both penalty precisions, both presets.  A configuration that
    fails to build records the tail of its error and the run goes on."""
    import torch

    from vla_verify import VLAConfig
    from vla_verify.backends.numpy_oracle import recurrence
    from vla_verify.backends.triton_chunked import chunked_vla
    from vla_verify.bench import _inputs
    from vla_verify.error_model import compare

    res = out.setdefault("compile_check", {})
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    for name, cfg in (("paper", VLAConfig()), ("exact", VLAConfig.exact())):
        for D in (16, 32, 64, 128):
            for dname, dt in dtypes.items():
                precs = ("ieee", "tf32") if dname == "float32" else ("tf32",)
                for pd, prec in ((pd, p) for pd in ("float64", "float32") for p in precs):
                    key = f"{name}_D{D}_{dname}_penalty_{pd}_{prec}"
                    x = _inputs(1, 100, 2, D, dt, "cuda", seed=D)
                    args = [x[n] for n in "qkvu"]
                    try:
                        o, _ = chunked_vla(
                            *args, config=cfg, penalty_dtype=pd, input_precision=prec
                        )
                        torch.cuda.synchronize()
                        seen = [a.double().cpu().numpy() for a in args]
                        ref = recurrence(*seen, config=cfg)
                        base = recurrence(*seen, config=cfg, dtype=dname)
                        c = compare("o", o.double().cpu().numpy(), ref.o, base.o, dname,
                                    terms=D + 64)  # fmt: skip
                        res[key] = {"ratio": float(c.ratio), "passed": bool(c.passed)}
                    except Exception as exc:
                        res[key] = {"error": (type(exc).__name__ + ": " + str(exc))[-1500:]}
                    _log("compile", key, res[key])
                    RUN["path"].write_text(json.dumps(out, indent=1))
                    if "illegal memory access" in res[key].get("error", ""):
                        return  # the CUDA context is lost: later launches would fail too


def oracle_check(out: dict[str, Any], penalty_chunk: int | None = None) -> None:
    """The bf16 kernel against the float64 oracle at T = 4096, D = 64 and 128, two heads
    (spec §4 budget from the bf16 oracle), at ``penalty_chunk`` (default: the kernel's)."""
    import numpy as np
    import torch

    from vla_verify import VLAConfig
    from vla_verify.backends.numpy_oracle import recurrence
    from vla_verify.backends.triton_chunked import chunked_vla
    from vla_verify.bench import _inputs
    from vla_verify.error_model import compare

    cfg = VLAConfig()
    for D in (64, 128):
        x = _inputs(1, 4096, 2, D, torch.bfloat16, "cuda", seed=D)
        args = [x[n] for n in "qkvu"]
        o, _ = chunked_vla(*args, config=cfg, penalty_chunk=penalty_chunk)
        seen = [a.double().cpu().numpy() for a in args]
        ref = recurrence(*seen, config=cfg)
        base = recurrence(*seen, config=cfg, dtype="bfloat16")
        c = compare("o", o.double().cpu().numpy(), ref.o, base.o, "bfloat16", terms=D + 64)
        name = f"bf16_T4096_D{D}_H2_o" + ("" if penalty_chunk is None else f"_P{penalty_chunk}")
        out["correctness"][name] = {
            "ratio": c.ratio,
            "max_err": float(np.max(c.error)),
            "passed": c.passed,
        }
        _log("check", D, out["correctness"][name])
        RUN["path"].write_text(json.dumps(out, indent=1))


def minimal(out: dict[str, Any]) -> None:
    """A short run: the bf16 kernel against the oracle at T = 4096, then the chunked forward
    and causal SDPA at D = 64, 128 and T = 4096, 16384, and the chunked forward's kernels."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    from vla_verify import VLAConfig
    from vla_verify.backends.numpy_oracle import recurrence
    from vla_verify.backends.triton_chunked import chunked_vla
    from vla_verify.bench import _inputs, time_ms
    from vla_verify.error_model import compare

    cfg = VLAConfig()
    for D in (64, 128):
        x = _inputs(1, 4096, 2, D, torch.bfloat16, "cuda", seed=D)
        args = [x[n] for n in "qkvu"]
        pd = _penalty_dtype(x, cfg)
        o, _ = chunked_vla(*args, config=cfg, penalty_dtype=pd)
        seen = [a.double().cpu().numpy() for a in args]
        ref = recurrence(*seen, config=cfg)
        base = recurrence(*seen, config=cfg, dtype="bfloat16")
        c = compare("o", o.double().cpu().numpy(), ref.o, base.o, "bfloat16", terms=D + 64)
        out["correctness"][f"bf16_T4096_D{D}_H2_o"] = {
            "ratio": c.ratio,
            "max_err": float(np.max(c.error)),
            "passed": c.passed,
        }
        _log("check", D, out["correctness"][f"bf16_T4096_D{D}_H2_o"])
        RUN["path"].write_text(json.dumps(out, indent=1))
    for D in (64, 128):
        for T in (4096, 16384):
            x = _inputs(1, T, 16, D, torch.bfloat16, "cuda")
            q, k, v, u = (x[n] for n in "qkvu")
            pd = _penalty_dtype(x, cfg)
            qh, kh, vh = (a.transpose(1, 2).contiguous() for a in (q, k, v))
            fns = {
                "vla_triton_chunked": lambda q=q, k=k, v=v, u=u, pd=pd: chunked_vla(
                    q, k, v, u, penalty_dtype=pd
                )[0],
                "sdpa": lambda a=qh, b=kh, c=vh: F.scaled_dot_product_attention(
                    a, b, c, is_causal=True
                ),
            }
            for op, fn in fns.items():
                rec = {"op": op, "B": 1, "T": T, "H": 16, "D": D, "dtype": "bfloat16",
                       "mode": "fwd", "median_ms": time_ms(fn)}  # fmt: skip
                if op == "vla_triton_chunked":
                    rec["penalty_dtype"] = pd
                out["records"].append(rec)
                _log(rec)
                RUN["path"].write_text(json.dumps(out, indent=1))
            if T == 4096:
                from torch.profiler import ProfilerActivity, profile

                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(3):
                        chunked_vla(q, k, v, u, penalty_dtype=pd)
                    torch.cuda.synchronize()
                kern = {
                    e.key: getattr(e, "device_time_total", 0.0) / 3 / 1e3
                    for e in prof.key_averages()
                    if "kernel" in e.key
                }
                out["breakdown"][f"D{D}_T{T}_ms"] = kern
                _log("breakdown", D, kern)
                RUN["path"].write_text(json.dumps(out, indent=1))


#: The forward's penalty-chain variants of ``--chain-variants``: (name, PENALTY_FACTORISATION,
#: penalty_dtype, PENALTY_CHAIN_WARPS by key tile width, or None: the default).
CHAIN_VARIANTS: tuple[tuple[str, str, str, dict[int, int] | None], ...] = (
    ("factor_inverse", "factor_inverse", "float64", None),
    ("elimination", "elimination", "float64", None),
    # Half the warps at both widths; twice at 64 (16 warps at 128 build with 64 registers and
    # 1344 bytes of stack per thread: not tried).
    ("elimination_half_warps", "elimination", "float64", {64: 2, 128: 4}),
    ("elimination_8_warps", "elimination", "float64", {64: 8}),
    ("factor_inverse_f32", "factor_inverse", "float32", None),
    ("elimination_f32", "elimination", "float32", None),
)


def _kernel_device_ms(fn: Any, kernel: str, calls: int = 5) -> float:
    """The device time of ``kernel`` per call of ``fn`` (torch.profiler, mean of ``calls``)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    us = sum(e.device_time_total for e in prof.key_averages() if e.key == kernel)
    return us / calls / 1000


def chain_variants(out: dict[str, Any]) -> None:
    """The chunked forward with each of :data:`CHAIN_VARIANTS` side by side, B = 1, H = grid_H,
    bf16, paper preset, at ``variant_T`` for each of ``variant_Ds``: first each variant's ``o``
    against the default's (relative max difference; the float64 variants agree to the float32
    gates' rounding), then the forward's median and the penalty chain kernel's device time
    (torch.profiler, mean of five calls)."""
    import torch

    from vla_verify import VLAConfig
    from vla_verify.backends import triton_chunked as tc
    from vla_verify.bench import _inputs, time_ms

    cfg = VLAConfig()
    H, dev, smoke = RUN["grid_H"], RUN["device"], RUN["smoke"]
    dt = torch.float32 if smoke else torch.bfloat16
    rows = out.setdefault("chain_variants", [])
    T = RUN["variant_T"]
    for D in RUN["variant_Ds"]:
        x = _inputs(1, T, H, D, dt, dev)
        args = tuple(x[n] for n in "qkvu")
        base = None
        default, default_warps = tc.PENALTY_FACTORISATION, tc.PENALTY_CHAIN_WARPS
        for name, factorisation, pd, warps in CHAIN_VARIANTS:
            tc.PENALTY_FACTORISATION = factorisation
            tc.PENALTY_CHAIN_WARPS = default_warps if warps is None else warps
            try:

                def fwd(pd: str = pd, args: tuple[Any, ...] = args) -> Any:
                    return tc.chunked_vla(*args, config=cfg, penalty_dtype=pd)[0]

                o = fwd().float()
                if base is None:
                    base = o
                diff = float((o - base).abs().max() / base.abs().max().clamp_min(1e-30))
                row: dict[str, Any] = {"D": D, "T": T, "variant": name, "rel_diff": diff}
                row["median_ms"] = time_ms(fwd, device=dev)
                if not smoke:
                    row["chain_kernel_ms"] = _kernel_device_ms(fwd, "penalty_chain_kernel")
                rows.append(row)
                _log(row)
            except Exception as exc:
                rows.append({"D": D, "T": T, "variant": name, "error": repr(exc)[:400]})
                _log("chain variant failed", name, D, repr(exc)[:400])
            finally:
                tc.PENALTY_FACTORISATION, tc.PENALTY_CHAIN_WARPS = default, default_warps
            if RUN.get("path"):
                RUN["path"].write_text(json.dumps(out, indent=1))
        del x, args, base
        if not smoke:
            torch.cuda.empty_cache()


def readout_variants(out: dict[str, Any]) -> None:
    """The read-out's value columns per program (``READOUT_VALUE_BLOCK``) side by side: at each
    of ``readout_Ts`` and ``variant_Ds`` (B = 1, H = grid_H, bf16, paper preset), for each of
    ``readout_blocks`` up to the value tile, first ``o`` against the default's (relative max
    difference), then the forward's median and the read-out kernel's device time
    (torch.profiler, mean of five calls)."""
    import torch

    from vla_verify import VLAConfig
    from vla_verify.backends import triton_chunked as tc
    from vla_verify.bench import _inputs, time_ms

    cfg = VLAConfig()
    H, dev, smoke = RUN["grid_H"], RUN["device"], RUN["smoke"]
    dt = torch.float32 if smoke else torch.bfloat16
    rows = out.setdefault("readout_variants", [])
    default = tc.READOUT_VALUE_BLOCK
    for D in RUN["variant_Ds"]:
        for T in RUN["readout_Ts"]:
            x = _inputs(1, T, H, D, dt, dev)
            args = tuple(x[n] for n in "qkvu")

            def fwd(args: tuple[Any, ...] = args) -> Any:
                return tc.chunked_vla(*args, config=cfg)[0]

            base = fwd().float()
            for width in RUN["readout_blocks"]:
                if width > max(16, 1 << (D - 1).bit_length()):
                    continue
                tc.READOUT_VALUE_BLOCK = {**default, max(16, 1 << (D - 1).bit_length()): width}
                row: dict[str, Any] = {"D": D, "T": T, "value_block": width}
                try:
                    o = fwd().float()
                    row["rel_diff"] = float((o - base).abs().max() / base.abs().max())
                    row["median_ms"] = time_ms(fwd, device=dev)
                    if not smoke:
                        row["readout_kernel_ms"] = _kernel_device_ms(fwd, "state_output_kernel")
                except Exception as exc:
                    row["error"] = repr(exc)[:400]
                finally:
                    tc.READOUT_VALUE_BLOCK = default
                rows.append(row)
                _log(row)
                if RUN.get("path"):
                    RUN["path"].write_text(json.dumps(out, indent=1))
            del x, args, base
            if not smoke:
                torch.cuda.empty_cache()


def block_variants(out: dict[str, Any]) -> None:
    """Penalty-chain blocks at the short lengths (``block_variant_Ts``), where the default
    (:func:`~vla_verify.backends.triton_chunked.penalty_block_length`, measured at T = 16384
    and 65536) runs one block of 1024 or 2048 tokens: the forward's median with each of
    ``block_variant_blocks`` (``None``: the default), B = 1, H = grid_H, bf16, paper preset, at
    each of ``variant_Ds``; each variant's ``o`` against the default's first (relative max
    difference, the float32 gates' rounding), and the kernel breakdown of the default and the
    shortest blocks at each size (torch.profiler, mean of five calls)."""
    import torch

    from vla_verify import VLAConfig
    from vla_verify.backends.triton_chunked import BLOCK_START_FALLBACKS, penalty_block_length
    from vla_verify.bench import _inputs, time_ms

    cfg = VLAConfig()
    H, dev, smoke = RUN["grid_H"], RUN["device"], RUN["smoke"]
    dt = torch.float32 if smoke else torch.bfloat16
    rows = out.setdefault("block_variants", [])
    for D in RUN["variant_Ds"]:
        for T in RUN["block_variant_Ts"]:
            x = _inputs(1, T, H, D, dt, dev)
            base = None
            blocks = RUN["block_variant_blocks"]
            for block in blocks:
                if block is not None and block > T:
                    continue
                tokens = T if block == 0 else block  # 0: one block
                fwd = _variant(x, cfg, tokens)
                before = BLOCK_START_FALLBACKS[0]
                try:
                    o = fwd().float()
                    if base is None:
                        base = o
                    diff = float((o - base).abs().max() / base.abs().max().clamp_min(1e-30))
                    row: dict[str, Any] = {
                        "D": D, "T": T, "penalty_block": block,
                        "block_tokens": penalty_block_length(T, 16, tokens, dk=D, heads=H,
                                                             device=dev),
                        "rel_diff": diff, "median_ms": time_ms(fwd, device=dev),
                    }  # fmt: skip
                    row["block_start_fallbacks"] = BLOCK_START_FALLBACKS[0] - before
                    if not smoke and block in (blocks[0], min(b for b in blocks if b)):
                        from torch.profiler import ProfilerActivity, profile

                        torch.cuda.synchronize()
                        with profile(activities=[ProfilerActivity.CUDA]) as prof:
                            for _ in range(5):
                                fwd()
                            torch.cuda.synchronize()
                        row["kernels_ms"] = {
                            e.key[:80]: e.device_time_total / 5 / 1000
                            for e in prof.key_averages()
                            if e.device_type.name == "CUDA"
                        }
                    rows.append(row)
                    _log({k: v for k, v in row.items() if k != "kernels_ms"})
                except Exception as exc:
                    rows.append({"D": D, "T": T, "penalty_block": block, "error": repr(exc)[:400]})
                    _log("block variant failed", D, T, block, repr(exc)[:400])
                if RUN.get("path"):
                    RUN["path"].write_text(json.dumps(out, indent=1))
            del x, base
            if not smoke:
                torch.cuda.empty_cache()


def host_trace(out: dict[str, Any]) -> None:
    """Where the chunked forward's wall time exceeds its device time: a torch.profiler trace
    (host and device activity) of three forwards after a warm-up, B = 1, H = grid_H, bf16, paper
    preset, at ``trace_Ts`` for each of ``variant_Ds``, exported as Chrome traces beside the
    JSON (``trace_D{D}_T{T}.json``); the JSON gets each size's wall time per call, the device
    time per call and the longest stretches with no kernel running, with the host operations
    that ran across each."""
    import torch

    from vla_verify import VLAConfig
    from vla_verify.bench import _inputs

    if RUN["smoke"]:
        return
    from torch.profiler import ProfilerActivity, profile

    cfg = VLAConfig()
    H, dev = RUN["grid_H"], RUN["device"]
    rows = out.setdefault("host_trace", [])
    folder = RUN["path"].parent if RUN.get("path") else Path(".")
    for D in RUN["variant_Ds"]:
        for T in RUN["trace_Ts"]:
            x = _inputs(1, T, H, D, torch.bfloat16, dev)
            fwd = _variant(x, cfg, None)
            fwd()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                t0 = time.perf_counter()
                for _ in range(3):
                    fwd()
                torch.cuda.synchronize()
                wall = (time.perf_counter() - t0) / 3
            prof.export_chrome_trace(str(folder / f"trace_D{D}_T{T}.json"))
            events = [e for e in prof.events() if e.device_type.name == "CUDA"]
            spans = sorted((e.time_range.start, e.time_range.end) for e in events)
            busy = sum(b - a for a, b in spans)
            gaps = [(b0, a1) for (_, b0), (a1, _) in itertools.pairwise(spans) if a1 > b0]
            host = [e for e in prof.events() if e.device_type.name == "CPU"]
            worst = []
            for a, b in sorted(gaps, key=lambda g: g[0] - g[1])[:12]:
                during = {e.name for e in host if e.time_range.start < b and e.time_range.end > a}
                worst.append({"gap_us": b - a, "host_ops": sorted(during)[:12]})
            row = {"D": D, "T": T, "wall_ms": wall * 1e3, "device_ms": busy / 3 / 1e3,
                   "gaps": worst, "host_functions": _host_functions(fwd)}  # fmt: skip
            rows.append(row)
            _log({k: v for k, v in row.items() if k != "gaps"})
            if RUN.get("path"):
                RUN["path"].write_text(json.dumps(out, indent=1))
            del x
            torch.cuda.empty_cache()


def _host_functions(fn: Any, calls: int = 10) -> dict[str, list[dict[str, Any]]]:
    """The host's time per call of ``fn`` by Python function (cProfile over ``calls`` calls,
    after which the device is awaited once): ``own``, the 30 functions of the longest own time,
    and ``package``, the package's functions by cumulative time, each with its own and
    cumulative microseconds per call.  The host runs ahead of the device, so these are the
    host's costs (launches, PyTorch's dispatch, Python), inflated alike by the profiler."""
    import cProfile
    import pstats

    import torch

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    rows = [
        {"function": f"{path.rsplit('/', 1)[-1]}:{line}({name})", "own_us": own / calls * 1e6,
         "cumulative_us": cum / calls * 1e6, "calls_per_call": n / calls,
         "package": "vla_verify" in path}
        for (path, line, name), (_, n, own, cum, _) in stats.items()
    ]  # fmt: skip
    return {
        "own": sorted(rows, key=lambda r: -r["own_us"])[:30],
        "package": sorted((r for r in rows if r["package"]), key=lambda r: -r["cumulative_us"]),
    }


def adjoint(out: dict[str, Any]) -> None:
    """The backward's adjoint seventeen ways (``--adjoint-modes``: some of them, with ``one_pass``),
    paper preset, B = 1, H = grid_H, at ``adjoint_sizes`` (``--adjoint-sizes``): ``one_pass``
    (``adjoint_blocks = 1``, the per-token adjoints), ``blocked`` (8 blocks),
    ``blocked_chunked_state`` (8 blocks and ``chunked_state_adjoint``),
    ``blocked16_chunked_state`` (16 blocks), and the state adjoint in chunks with the penalty
    adjoint in pieces (``chunked_penalty_adjoint``) in one pass
    (``one_pass_pieces``) and in 8 blocks (``blocked_pieces``), and the gate rerun from every
    checkpoint side by side (``parallel_rerun``) in one pass with the per-token adjoints
    (``one_pass_rerun``), with the chunked ones (``one_pass_pieces_rerun``) and with the state
    adjoint in chunks only (``one_pass_state_rerun``), and the forward keeping its gate values
    for the backward (``keep_gate_values``, no rerun: ``one_pass_pieces_kept``,
    ``one_pass_state_kept``, ``one_pass_kept``; the recurrent backend's forward only), and
    ``one_pass_pieces_rerun`` with the pieces' scan in groups of ``m`` pieces
    (``penalty_scan_group``: ``one_pass_pieces_rerun_group<m>``, m = 1, 4, 8, 16, 32) and with
    the prep kernels' registers capped at 128 (``prep_register_cap``:
    ``one_pass_pieces_rerun_prepcap128``).  The
    chunked backend's backward reads the chain values its forward kept;
    ``vla_triton_chunked_rerun`` times it rerunning the gate pass instead, beside it.

    Correctness first: float32 gradients of the recurrent backend in each mode, and of the
    chunked backend with its backward in that mode (``chunked_<mode>``), against the recurrent
    backend's float64 one-pass gradients at ``adjoint_check``; each must err at most twice what
    one pass errs plus the chunked float32 floor ``(D + 64 + 2)·eps·max|g|``.  Then forward +
    backward times of both VLA backends in every mode beside SDPA and fla's chunk kernels
    (``_grid_fwdbwd_fns``), in one run; last, each size's kernel breakdown with the default
    plan (:func:`_adjoint_breakdown`)."""
    import dataclasses

    import torch

    from vla_verify import VLAConfig
    from vla_verify.backends import triton_fused as fused
    from vla_verify.bench import _inputs, time_ms

    cfg = VLAConfig()
    res: dict[str, Any] = {"check": {}, "records": []}
    out["adjoint"] = res
    H, dev = RUN["grid_H"], RUN["device"]
    default_plan = fused.plan_for
    per_token = {"chunked_state_adjoint": False, "chunked_penalty_adjoint": False}
    chunked = {"chunked_state_adjoint": True, "chunked_penalty_adjoint": True}
    modes = {
        "one_pass": {"adjoint_blocks": 1, **per_token},
        "blocked": {"adjoint_blocks": 8, **per_token},
        "blocked_chunked_state": {**per_token, "adjoint_blocks": 8, "chunked_state_adjoint": True},
        "blocked16_chunked_state": {**per_token, "adjoint_blocks": 16,
                                    "chunked_state_adjoint": True},
        "one_pass_pieces": {"adjoint_blocks": 1, **chunked},
        "blocked_pieces": {"adjoint_blocks": 8, **chunked},
        "one_pass_rerun": {"adjoint_blocks": 1, **per_token, "parallel_rerun": True},
        "one_pass_pieces_rerun": {"adjoint_blocks": 1, **chunked, "parallel_rerun": True},
        "one_pass_state_rerun": {"adjoint_blocks": 1, **per_token, "chunked_state_adjoint": True,
                                 "parallel_rerun": True},
        "one_pass_pieces_kept": {"adjoint_blocks": 1, **chunked, "keep_gate_values": True},
        "one_pass_state_kept": {"adjoint_blocks": 1, **per_token, "chunked_state_adjoint": True,
                                "keep_gate_values": True},
        "one_pass_kept": {"adjoint_blocks": 1, **per_token, "keep_gate_values": True},
        **{f"one_pass_pieces_rerun_group{m}": {"adjoint_blocks": 1, **chunked,
                                               "parallel_rerun": True, "penalty_scan_group": m}
           for m in (1, 4, 8, 16, 32)},
        "one_pass_pieces_rerun_prepcap128": {"adjoint_blocks": 1, **chunked,
                                             "parallel_rerun": True, "prep_register_cap": 128},
    }  # fmt: skip
    modes = {name: {"parallel_rerun": False, "keep_gate_values": False, **options}
             for name, options in modes.items()
             if name == "one_pass" or name in RUN.get("adjoint_modes", modes)}  # fmt: skip

    def mode(name: str) -> Any:
        def plan_for(*a: Any) -> Any:
            return dataclasses.replace(default_plan(*a), **modes[name])

        fused.plan_for = plan_for  # type: ignore[assignment]
        return plan_for

    def grads(x: dict[str, Any], dtype: Any, name: str, chunked: bool = False) -> list[Any]:
        mode(name)
        leaves = [x[n].to(dtype).detach().requires_grad_(True) for n in "qkvu"]
        if chunked:  # its backward: the recurrent adjoint in this mode, from its chain values
            from vla_verify.backends.triton_chunked import chunked_vla

            o, _ = chunked_vla(*leaves, config=cfg)
        else:
            o, _ = fused.fused_recurrent_vla(*leaves, config=cfg)
        return list(torch.autograd.grad(o, leaves, x["do"].to(dtype)))

    try:
        D, T = RUN["adjoint_check"]
        x = _inputs(1, T, H, D, torch.float32, dev)
        ref = grads(x, torch.float64, "one_pass")
        runs = {}
        for name in modes:
            try:
                runs[name] = grads(x, torch.float32, name)
            except Exception as exc:  # a mode that does not build here: recorded, not timed
                res["check"][name] = {"failed": repr(exc)[:400]}
                _log("adjoint check failed", name, repr(exc)[:400])
        built = list(runs)
        # The chunked backend's gradients in each mode, against the same reference and budget.
        for name in built:
            try:
                runs[f"chunked_{name}"] = grads(x, torch.float32, name, chunked=True)
            except Exception as exc:
                res["check"][f"chunked_{name}"] = {"failed": repr(exc)[:400]}
                _log("adjoint check failed", "chunked", name, repr(exc)[:400])
        eps = float(torch.finfo(torch.float32).eps)
        for name, got in runs.items():
            res["check"][name] = {}
            for g, r, a, b in zip("qkvu", ref, runs["one_pass"], got, strict=True):
                err_one = float((a.double() - r).abs().max())
                err = float((b.double() - r).abs().max())
                budget = 2 * err_one + (D + 64 + 2) * eps * float(r.abs().max())
                res["check"][name][g] = {"error": err, "one_pass_error": err_one,
                                         "budget": budget, "passed": err <= budget}  # fmt: skip
        res["check"]["D"], res["check"]["T"] = D, T
        res["check"]["blocks"] = default_plan(1, H, T, D, D, torch.float32, x["q"].device, True)
        res["check"]["blocks"] = res["check"]["blocks"].adjoint_blocks
        _log("adjoint check", res["check"])
        del x, ref, runs
        for D, T in RUN["adjoint_sizes"]:
            x = _inputs(1, T, H, D, torch.float32 if RUN["smoke"] else torch.bfloat16, dev)
            for name in built:
                plan_for = mode(name)
                fns = _grid_fwdbwd_fns(x, cfg, T, D)
                if "vla_triton_chunked" in fns:
                    fns["vla_triton_chunked_rerun"] = _rerun_instead(fns["vla_triton_chunked"])
                for op, fn in fns.items():
                    if name != "one_pass" and not op.startswith("vla_"):
                        continue  # the anchors once
                    if op not in RUN.get("adjoint_ops", (op,)):
                        continue
                    try:
                        ms = time_ms(fn, device=dev)
                    except Exception as exc:
                        _log("adjoint timing failed", op, name, D, T, repr(exc)[:400])
                        continue
                    plan = plan_for(1, H, T, D, D, x["q"].dtype, x["q"].device, True)
                    vla = op.startswith("vla_")
                    rec = {"op": op, "mode": name if vla else None, "D": D, "T": T, "H": H,
                           "median_ms": ms,
                           "adjoint_blocks": plan.adjoint_blocks if vla else None}  # fmt: skip
                    res["records"].append(rec)
                    _log(rec)
                    if RUN.get("path"):
                        RUN["path"].write_text(json.dumps(out, indent=1))
            fused.plan_for = default_plan  # type: ignore[assignment]
            if RUN.get("adjoint_breakdown", True):
                _adjoint_breakdown(out, x, cfg, T, D)
            del x
            if not RUN["smoke"]:
                torch.cuda.empty_cache()
    finally:
        fused.plan_for = default_plan  # type: ignore[assignment]


def _rerun_instead(fn: Any) -> Any:
    """``fn`` (a forward + backward of the chunked backend) with its backward rerunning the gate
    pass from the checkpoints instead of reading the chain values its forward kept."""
    from vla_verify.backends import triton_chunked as tc

    def run() -> Any:
        kept = tc._recurrent_adjoint
        tc._recurrent_adjoint = lambda *a: kept(*a[:9], None)  # type: ignore[assignment]
        try:
            return fn()
        finally:
            tc._recurrent_adjoint = kept  # type: ignore[assignment]

    return run


def training_breakdown(out: dict[str, Any]) -> None:
    """Where a training step's device time goes: :func:`_adjoint_breakdown` at each of
    ``adjoint_sizes``, without the modes and the gradient check of :func:`adjoint`."""
    import torch

    from vla_verify import VLAConfig
    from vla_verify.bench import _inputs

    out["adjoint"] = {}
    for D, T in RUN["adjoint_sizes"]:
        x = _inputs(1, T, RUN["grid_H"], D, torch.float32 if RUN["smoke"] else torch.bfloat16,
                    RUN["device"])  # fmt: skip
        _adjoint_breakdown(out, x, VLAConfig(), T, D)


def _adjoint_breakdown(out: dict[str, Any], x: dict[str, Any], cfg: Any, T: int, D: int) -> None:
    """Device time per kernel (torch.profiler, mean of 3) of one forward + backward of each VLA
    backend with the default plan: where the training step's time goes."""
    import torch

    if RUN["smoke"]:
        return
    from torch.profiler import ProfilerActivity, profile

    try:
        for op, fn in _grid_fwdbwd_fns(x, cfg, T, D).items():
            if not op.startswith("vla_"):
                continue
            fn()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(3):
                    fn()
                torch.cuda.synchronize()
            kern = {
                e.key: getattr(e, "device_time_total", 0.0) / 3 / 1e3
                for e in prof.key_averages()
                if e.device_type.name == "CUDA"
            }
            kern = dict(sorted(kern.items(), key=lambda kv: -kv[1]))
            out["adjoint"].setdefault("breakdown", {})[f"{op}_D{D}_T{T}_ms"] = kern
            _log("adjoint breakdown", op, D, T, list(kern.items())[:8])
            if RUN.get("path"):
                RUN["path"].write_text(json.dumps(out, indent=1))
    except Exception as exc:
        _log("adjoint breakdown failed", op, D, T, repr(exc)[:400])


def _dxt(text: str) -> tuple[int, int]:
    """A ``DxT`` argument, e.g. ``64x16384``, as ``(D, T)``."""
    d, t = text.split("x")
    return int(d), int(t)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="toy sizes on the CPU interpreter")
    ap.add_argument("--minimal", action="store_true", help="a short run (function minimal)")
    ap.add_argument(
        "--penalty-chunk-check",
        type=int,
        default=None,
        metavar="P",
        help="only the oracle check at penalty_chunk P, then the call overheads",
    )
    ap.add_argument(
        "--short",
        action="store_true",
        help="the oracle check at T = 4096, then the grid at T <= 16384 (no validate)",
    )
    ap.add_argument("--skip-correctness", action="store_true")
    ap.add_argument(
        "--resume",
        type=Path,
        default=None,
        metavar="JSON",
        help="go on from a grid's chunk.json that a time limit cut, at the same commit: its "
        "correctness (where all of it ran) and its complete rows are kept (resumed)",
    )
    ap.add_argument(
        "--graphs",
        action="store_true",
        help="the grid's forwards also replayed from CUDA graphs (eager_ms and graph_ms)",
    )
    ap.add_argument(
        "--chain-variants",
        action="store_true",
        help="the forward's penalty-chain variants side by side (CHAIN_VARIANTS), then stop",
    )
    ap.add_argument(
        "--block-variants",
        action="store_true",
        help="penalty-chain blocks at short lengths (block_variants); with --chain-variants, "
        "after it",
    )
    ap.add_argument(
        "--block-variant-Ts",
        type=int,
        nargs="+",
        default=None,
        metavar="T",
        help="--block-variants' lengths (default: "
        + " ".join(map(str, RUN["block_variant_Ts"]))
        + ")",
    )
    ap.add_argument(
        "--block-variant-blocks",
        type=int,
        nargs="+",
        default=None,
        metavar="TOKENS",
        help="--block-variants' block lengths besides the default (0: one block; default: "
        + " ".join(str(b) for b in RUN["block_variant_blocks"] if b)
        + ")",
    )
    ap.add_argument(
        "--variant-D",
        type=int,
        nargs="+",
        default=None,
        help="the variants' head widths (default: " + " ".join(map(str, RUN["variant_Ds"])) + ")",
    )
    ap.add_argument(
        "--host-trace",
        action="store_true",
        help="torch.profiler traces of the forward: wall against device time, the idle gaps "
        "(host_trace); with the variants, after them",
    )
    ap.add_argument(
        "--readout-variants",
        action="store_true",
        help="the read-out's value columns per program (READOUT_VALUE_BLOCK) side by side "
        "(readout_variants), at --variant-D; after --chain-variants",
    )
    ap.add_argument("--D", type=int, nargs="+", default=None, help="the grid's head widths")
    ap.add_argument(
        "--fwdbwd-chunked-max-T",
        type=int,
        default=None,
        help="time the chunked forward + backward up to this T (default %(default)s: the run's)",
    )
    ap.add_argument(
        "--grad-only",
        nargs="+",
        metavar="DxT",
        help="only the gradient check (B = 1, H = 2, float32) at these sizes, e.g. 64x200 128x200",
    )
    ap.add_argument(
        "--no-block-variants",
        action="store_true",
        help="after the grid, only the forward's breakdown and the call overheads (no "
        "penalty-chain block lengths side by side)",
    )
    ap.add_argument(
        "--correctness-only", action="store_true", help="every correctness step, no timing"
    )
    ap.add_argument(
        "--quick-correctness",
        action="store_true",
        help="the quick correctness steps, then the whole grid (T to 65536)",
    )
    ap.add_argument(
        "--compile-check", action="store_true", help="first build every kernel configuration"
    )
    ap.add_argument(
        "--adjoint",
        action="store_true",
        help="only the blocked adjoint against one pass (gradients, times, kernel breakdown)",
    )
    ap.add_argument(
        "--training-breakdown",
        action="store_true",
        help="only the device time per kernel of forward + backward with the default plan, at "
        "--adjoint-sizes (the last step of --adjoint, alone)",
    )
    ap.add_argument(
        "--forward-breakdown",
        nargs="+",
        type=_dxt,
        default=None,
        metavar="DxT",
        help="only the device time per kernel of the forward with the default plan at these "
        "sizes, e.g. 64x4096 64x16384",
    )
    ap.add_argument(
        "--adjoint-sizes",
        nargs="+",
        type=_dxt,
        default=None,
        metavar="DxT",
        help="--adjoint's sizes, e.g. 64x16384 128x16384 (default: "
        + " ".join(f"{d}x{t}" for d, t in RUN["adjoint_sizes"])
        + ")",
    )
    ap.add_argument(
        "--adjoint-modes",
        nargs="+",
        default=None,
        metavar="MODE",
        help="--adjoint's modes besides one_pass (default: all)",
    )
    ap.add_argument(
        "--adjoint-ops",
        nargs="+",
        default=None,
        metavar="OP",
        help="--adjoint's timed ops (default: every VLA op in every mode, the anchors once)",
    )
    ap.add_argument(
        "--no-adjoint-breakdown", action="store_true", help="--adjoint without the kernel breakdown"
    )
    ap.add_argument(
        "--adjoint-check",
        type=_dxt,
        default=None,
        metavar="DxT",
        help="--adjoint's gradient check size (default: "
        + "x".join(str(n) for n in RUN["adjoint_check"])
        + ")",
    )
    a = ap.parse_args()
    if a.adjoint_modes:
        RUN["adjoint_modes"] = tuple(a.adjoint_modes)
    if a.adjoint_ops:
        RUN["adjoint_ops"] = tuple(a.adjoint_ops)
    if a.no_adjoint_breakdown:
        RUN["adjoint_breakdown"] = False
    if a.smoke:
        RUN.update(SMOKE)
    if a.D:
        RUN["grid_Ds"] = tuple(a.D)
    if a.adjoint_sizes:
        RUN["adjoint_sizes"] = tuple(a.adjoint_sizes)
    if a.adjoint_check:
        RUN["adjoint_check"] = a.adjoint_check
    if a.fwdbwd_chunked_max_T is not None:
        RUN["fwdbwd_chunked_max_T"] = a.fwdbwd_chunked_max_T
    if a.graphs:
        RUN["graphs"] = True
    if a.block_variant_Ts:
        RUN["block_variant_Ts"] = tuple(a.block_variant_Ts)
    if a.block_variant_blocks:
        RUN["block_variant_blocks"] = (None, *a.block_variant_blocks)
    RUN["no_block_variants"] = a.no_block_variants
    if a.variant_D:
        RUN["variant_Ds"] = tuple(a.variant_D)
    from vla_verify.bench import machine_info

    out: dict[str, Any] = {"machine": {**machine_info(), "commit": a.commit}, "records": [],
                           "correctness": {}, "variants": [], "breakdown": {}}  # fmt: skip
    if a.resume is not None:
        out = resumed(json.loads(a.resume.read_text()), out["machine"])
    path = Path(a.out) / "chunk.json"
    RUN["path"] = path
    t0 = time.time()

    def full() -> None:
        # A resumed grid keeps its correctness only where all of it ran (its seconds are
        # written after the last step).
        if not a.skip_correctness and "correctness_seconds" not in out:
            correctness(out, a.quick or a.quick_correctness)
        out["correctness_seconds"] = round(time.time() - t0, 1)
        path.write_text(json.dumps(out, indent=1))
        if a.correctness_only:
            return
        timing(out, a.quick)
        analyse(out, path)

    def short() -> None:
        oracle_check(out)
        timing(out, quick=True)
        analyse(out, path)

    def penalty_chunk_check() -> None:
        oracle_check(out, a.penalty_chunk_check)
        overhead(out)

    steps = [lambda: compile_check(out)] if a.compile_check else []
    if a.penalty_chunk_check is not None:
        steps.append(penalty_chunk_check)
    elif a.short:
        steps.append(short)
    elif a.minimal:
        steps.append(lambda: minimal(out))
    elif a.grad_only:
        for size in a.grad_only:
            D, T = (int(n) for n in size.split("x"))
            steps.append(functools.partial(grad_check, out["correctness"], (1, T, 2, D),
                                           f"grad_D{D}_T{T}"))  # fmt: skip
    elif a.adjoint:
        steps.append(lambda: adjoint(out))
    elif a.training_breakdown:
        steps.append(lambda: training_breakdown(out))
    elif a.forward_breakdown:
        RUN["forward_breakdown_sizes"] = tuple(a.forward_breakdown)
        steps.append(lambda: forward_breakdown(out))
    elif a.chain_variants or a.block_variants or a.host_trace or a.readout_variants:
        if a.chain_variants:
            steps.append(lambda: chain_variants(out))
        if a.readout_variants:
            steps.append(lambda: readout_variants(out))
        if a.block_variants:
            steps.append(lambda: block_variants(out))
        if a.host_trace:
            steps.append(lambda: host_trace(out))
    elif not a.compile_check:
        steps.append(full)
    for step in steps:
        # Each step keeps what it measured if a later one fails: the traceback goes to the JSON.
        try:
            step()
        except Exception:
            out["error"] = traceback.format_exc()
            _log(out["error"])
        out["seconds"] = round(time.time() - t0, 1)
        path.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
