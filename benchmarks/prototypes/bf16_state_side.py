"""The chunked kernel's state side with 16-bit intermediates, for its precision (not a backend;
design doc ``docs/design/triton_chunked.md``, "The floor", further way 3).

The state side's intermediates (the gates ``α̂``, the UT transform's ``K̃ = T K̂`` and
``Ṽ = T V``, the residuals ``E``, the chunk-start states ``S``) in float32 with tf32 products,
or in bf16 with bf16 products, as fla's kernels keep theirs: bf16 halves the bytes and doubles
the product rate of the UT transform, the state chain and the read-out.  Its precision: this
module runs the state side of spec §5 in PyTorch with every intermediate rounded where such a
kernel would store it (``storage``) and every product's operands rounded as its tensor cores
would take them (``product``), from the float64 oracle's gates, and compares ``o`` and the last
``S`` with the spec §4 budget for bf16 inputs (the float64 oracle against the oracle run in
bf16, every operation of which rounds to bf16; ``terms = dk + C``).

Roundings: ``float32`` (none), ``tf32`` (10 mantissa bits, round to nearest even), ``bf16``
(7), and ``e3`` (3), a planted coarse rounding that the comparison must reject.

``triton_chunked`` takes the dtype of those intermediates from one function,
``_state_dtype``; its UT transform, state chain and read-out multiply in that dtype.  It
keeps bf16 inputs' intermediates in bf16 in inference.
``python benchmarks/prototypes/bf16_state_side.py --gpu OUT`` runs the kernel with bf16
intermediates in training too and, on a GPU, first validates it so
(:func:`vla_verify.validate`, bf16, the paper preset, keys 64 and 128 wide, the checker's
default reach), then times the forward and forward + backward with them and with float32
intermediates throughout (:func:`float32_state_dtype`), side by side (B = 1, H = 16, bf16,
paper preset; ``triton.testing.do_bench`` medians, the two alternated twice, the lower kept)
with the state kernels' device time (torch.profiler, mean of
five calls), writing ``OUT/bf16_state_side_gpu.json`` (:func:`gpu`).

``python benchmarks/prototypes/bf16_state_side.py OUT`` runs the float32 rounding
(float32 storage, tf32 products), the bf16 one and the planted one on layer-like, concentrated
and strong Gaussian penalties (B = 1, H = 2, dk = dv = 64, T = 1024, C = 64, paper preset,
three seeds each; an example where the oracle run in bf16 is not finite has no budget and is
recorded as such) and writes ``OUT/bf16_state_side.json``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vla_verify import VLAConfig
from vla_verify.backends.numpy_oracle import recurrence
from vla_verify.error_model import compare

ROUNDINGS = ("float32", "tf32", "bf16", "e3")
#: (storage, product) of the kernel today for 16-bit inputs, of the 16-bit variant, and planted.
SCHEMES = {"current": ("float32", "tf32"), "bf16": ("bf16", "bf16"), "planted_e3": ("e3", "bf16")}


def round_to(x: torch.Tensor, how: str) -> torch.Tensor:
    """``x`` (float32) rounded to nearest even at ``how``'s mantissa width, as float32."""
    if how == "float32":
        return x
    if how == "bf16":
        return x.to(torch.bfloat16).float()
    drop = {"tf32": 13, "e3": 20}[how]  # float32 mantissa bits dropped
    bits = x.contiguous().view(torch.int32).to(torch.int64)
    half = (1 << (drop - 1)) - 1
    bits = (bits + half + ((bits >> drop) & 1)) & ~((1 << drop) - 1)
    return bits.to(torch.int32).view(torch.float32)


def state_side(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gates: torch.Tensor,
    *,
    C: int,
    storage: str,
    product: str,
    config: VLAConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``o`` ``[B, T, H, dv]`` and the last ``S`` ``[B, H, dv, dk]`` by spec §5's state chain
    (UT transform, ``E`` and ``S`` chunk after chunk, read-out) from the gates ``α̂``
    ``[B, T, H, dk]``, in float32 with the intermediates rounded as ``storage`` and every
    product's operands as ``product``.  With ``float32`` both and float64 inputs it is the
    exact chunked form in float64 (its known-answer test)."""
    dt = q.dtype
    B, T, H, dk = q.shape
    dv = v.shape[-1]

    def s(x: torch.Tensor) -> torch.Tensor:
        return x if dt == torch.float64 else round_to(x, storage)

    def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if dt == torch.float64:
            return a @ b
        return round_to(a, product) @ round_to(b, product)

    o = torch.empty(B, T, H, dv, dtype=dt)
    S_out = torch.empty(B, H, dv, dk, dtype=dt)
    kh = k / k.norm(dim=-1, keepdim=True).clamp_min(config.norm_eps)
    z = torch.cumsum(k, dim=1)
    for b in range(B):
        for h in range(H):
            S = torch.zeros(dv, dk, dtype=dt)
            for c0 in range(0, T, C):
                sl = slice(c0, min(c0 + C, T))
                Kh, Q, V = kh[b, sl, h], q[b, sl, h], v[b, sl, h]
                Ag = s(gates[b, sl, h])
                n = Kh.shape[0]
                N = torch.tril(mm(Kh, Ag.T), -1)
                eye = torch.eye(n, dtype=dt)
                Tm = torch.linalg.solve_triangular(eye + N, eye, upper=False)
                Kt, Vt = s(mm(Tm, Kh)), s(mm(Tm, V))
                Sc = s(S)
                E = s(Vt - mm(Kt, Sc.T))
                O = mm(Q, Sc.T) + mm(torch.tril(mm(Q, Ag.T)), E)
                if config.normalize_output:
                    zq = (z[b, sl, h] * Q).sum(-1, keepdim=True)
                    O = O / zq.clamp_min(config.out_eps)
                o[b, sl, h] = O
                S = S + mm(E.T, Ag)
            S_out[b, h] = S
    return o, S_out


def inputs(T: int, dk: int, dv: int, penalties: str, seed: int, H: int = 2) -> list[np.ndarray]:
    """Layer-like q, k > 0 and v (spec §2.5) with penalties ``layer`` (``||u||² = 1/dk``),
    ``concentrated`` (layer-like directions within a narrow cone) or ``gaussian``
    (``u ~ N(0, 16 I / dk)``, ``||u|| ≈ 4``: strong penalties), as float64."""
    rng = np.random.default_rng(seed)
    q = np.exp(0.5 * rng.standard_normal((1, T, H, dk)))
    k = np.exp(0.5 * rng.standard_normal((1, T, H, dk)))
    v = rng.standard_normal((1, T, H, dv))
    u = rng.standard_normal((1, T, H, dk))
    if penalties == "concentrated":
        u = rng.standard_normal((1, 1, H, dk)) + 0.05 * u
    if penalties in ("layer", "concentrated"):
        u = u / np.linalg.norm(u, axis=-1, keepdims=True) / np.sqrt(dk)
    else:
        u = u * 4 / np.sqrt(dk)
    return [q, k, v, u]


def ratios(
    x: list[np.ndarray], config: VLAConfig, C: int, schemes: dict[str, tuple[str, str]]
) -> dict[str, dict[str, float]]:
    """Each scheme's worst error / budget for ``o`` and the last ``S`` against the float64
    oracle, the baseline the oracle run in bf16, on the inputs rounded to bf16.  Where the bf16
    oracle itself is not finite there is no budget, and this says so (ValueError)."""
    t = [torch.tensor(a).to(torch.bfloat16) for a in x]
    seen = [a.double().numpy() for a in t]
    ref = recurrence(*seen, config=config, return_states=True)
    base = recurrence(*seen, config=config, dtype="bfloat16")
    if not (np.isfinite(base.o).all() and np.isfinite(base.state[0]).all()):
        raise ValueError("the oracle run in bf16 is not finite here: spec §4 sets no budget")
    gates = torch.tensor(ref.history.gate, dtype=torch.float32)
    q, k, v = (a.float() for a in t[:3])
    dk = x[0].shape[-1]
    out: dict[str, dict[str, float]] = {}
    for name, (storage, product) in schemes.items():
        o, S = state_side(q, k, v, gates, C=C, storage=storage, product=product, config=config)
        got = {"o": o, "S": S}
        refs = {"o": ref.o, "S": ref.state[0]}
        bases = {"o": base.o, "S": base.state[0]}
        out[name] = {}
        for key in got:
            c = compare(key, got[key].double().numpy(), refs[key], bases[key], "bfloat16",
                        terms=dk + C)  # fmt: skip
            out[name][key] = c.ratio
    return out


def main(out: Path) -> None:
    config = VLAConfig()
    rows = []
    t0 = time.perf_counter()
    for penalties in ("layer", "concentrated", "gaussian"):
        for seed in range(3):
            row: dict[str, Any] = {"penalties": penalties, "seed": seed}
            try:
                row["ratios"] = ratios(inputs(1024, 64, 64, penalties, seed), config, 64, SCHEMES)
            except ValueError as exc:  # no bf16 budget for this example
                row["ratios"], row["reason"] = None, str(exc)
            rows.append(row)
            print(json.dumps(row), flush=True)
    judged = [r["ratios"] for r in rows if r["ratios"] is not None]
    worst = {name: {key: max(r[name][key] for r in judged) for key in ("o", "S")}
             for name in SCHEMES}  # fmt: skip
    write_study(out / "bf16_state_side.json", {
        "command": "python benchmarks/prototypes/bf16_state_side.py OUT",
        "settings": {"B": 1, "H": 2, "dk": 64, "dv": 64, "T": 1024, "C": 64, "preset": "paper"},
        "schemes": {k: {"storage": s, "product": p} for k, (s, p) in SCHEMES.items()},
    }, rows, worst, t0)  # fmt: skip


def write_study(path: Path, head: dict[str, Any], rows: list[Any], worst: Any, t0: float) -> None:
    """A precision study's JSON: ``head`` (command, settings), its rows, the worst ratios and
    the seconds since ``t0``; the worst ratios printed."""
    res = {**head, "rows": rows, "worst": worst, "seconds": time.perf_counter() - t0}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=1))
    print(json.dumps(worst))


def bf16_state_dtype(dtype: torch.dtype, training: bool = False) -> torch.dtype:
    """``triton_chunked._state_dtype`` with bf16 intermediates for bf16 inputs, in training
    too; other inputs float32."""
    del training
    return torch.bfloat16 if dtype == torch.bfloat16 else torch.float32


def float32_state_dtype(dtype: torch.dtype, training: bool = False) -> torch.dtype:
    """``triton_chunked._state_dtype`` with float32 intermediates for every input."""
    del dtype, training
    return torch.float32


STATE_KERNELS = ("state_prep_kernel", "state_starts_kernel", "state_output_kernel")


def gpu(out: Path, sizes: tuple[tuple[int, int], ...] = ((64, 4096), (64, 16384), (128, 16384))
        ) -> None:  # fmt: skip
    """On a GPU: validate the kernel with bf16 intermediates, then time it beside the default."""
    from torch.profiler import ProfilerActivity, profile

    from vla_verify import backends, validate
    from vla_verify.backends import triton_chunked as tc
    from vla_verify.bench import _grad_op, _inputs, machine_info, time_ms

    default = tc._state_dtype
    variants = {"float32": float32_state_dtype, "bf16": bf16_state_dtype}
    res: dict[str, Any] = {"machine": machine_info(), "validate": {}, "rows": []}
    config = VLAConfig()
    out.mkdir(parents=True, exist_ok=True)
    path = out / "bf16_state_side_gpu.json"
    try:
        tc._state_dtype = bf16_state_dtype
        for dk in (64, 128):
            t0 = time.perf_counter()
            rep = validate(backends.get("triton_chunked"), config=config, array="torch",
                           dtype="bfloat16", device="cuda", max_examples=2, seed=dk,
                           max_dk=dk)  # fmt: skip
            res["validate"][f"bfloat16_paper_dk{dk}"] = {
                "passed": rep.passed, "examples": rep.examples, "worst_ratio": rep.worst_ratio,
                "seconds": round(time.perf_counter() - t0, 1),
                "summary": "" if rep.passed else rep.summary(),
            }  # fmt: skip
            print(dk, res["validate"][f"bfloat16_paper_dk{dk}"], flush=True)
            path.write_text(json.dumps(res, indent=1))  # what ran survives a cut run
        for D, T in sizes:
            x = _inputs(1, T, 16, D, torch.bfloat16, "cuda")
            args = [x[n] for n in "qkvu"]
            leaves = [x[n].detach().clone().requires_grad_(True) for n in "qkvu"]

            def fwd(args: list[Any] = args) -> Any:
                return tc.chunked_vla(*args, config=config)[0]

            fns = {"fwd": fwd, "fwdbwd": _grad_op(lambda *a: fwd(list(a)), leaves, x["do"])}
            row: dict[str, Any] = {"D": D, "T": T}
            outs = {}
            for name, fn_dtype in variants.items():
                tc._state_dtype = fn_dtype
                outs[name] = fwd().float()
            ref = outs["float32"]
            row["o_relative_difference"] = float((outs["bf16"] - ref).abs().max()
                                                 / ref.abs().max())  # fmt: skip
            for mode, fn in fns.items():
                for name in (*variants, *variants):
                    tc._state_dtype = variants[name]
                    ms = time_ms(fn)
                    row[f"{mode}_{name}_ms"] = min(row.get(f"{mode}_{name}_ms", ms), ms)
            for name, fn_dtype in variants.items():
                tc._state_dtype = fn_dtype
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(5):
                        fwd()
                    torch.cuda.synchronize()
                row[f"{name}_state_kernels_ms"] = {
                    e.key: e.device_time_total / 5 / 1000 for e in prof.key_averages()
                    if e.key in STATE_KERNELS
                }  # fmt: skip
            res["rows"].append(row)
            print(json.dumps(row), flush=True)
            path.write_text(json.dumps(res, indent=1))
    finally:
        tc._state_dtype = default


if __name__ == "__main__":
    if sys.argv[1:2] == ["--gpu"]:
        gpu(Path(sys.argv[2]))
    else:
        main(Path(sys.argv[1]))
