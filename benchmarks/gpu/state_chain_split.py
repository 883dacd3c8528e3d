"""Experiment: the chunked kernel's state chain split in two launches, against the single loop.

``triton_chunked.SPLIT_STATE_CHAIN[0]`` picks the state chain: true, a sequential kernel that
only carries ``S`` (``E_c = Ṽ_c − K̃_c S_cᵀ``, ``S_{c+1} = S_c + E_cᵀ Â_c``) and stores each
chunk's start state, then a kernel over every chunk at once for the read-outs (as fla's
``chunk_fwd_h`` / ``chunk_fwd_o``); false, the shipped kernel with the read-outs inside the
sequential loop.  Correctness first (the two against each other on fresh inputs, and
``validate`` of the split path), then ``do_bench`` medians side by side with fla's
``chunk_delta_rule`` and causal SDPA, B = 1, H = 16, bf16, paper preset, and the split path's
kernel breakdown.  Usage: ``python benchmarks/gpu/state_chain_split.py OUT``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from vla_verify import VLAConfig, backends, validate
from vla_verify.backends import triton_chunked
from vla_verify.bench import _inputs, time_ms
from vla_verify.experiments.runner import provenance


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30))


def measure(D: int, T: int, cfg: VLAConfig, report: dict) -> None:
    """The two state chains against each other, then the medians of both and the anchors."""
    x = _inputs(1, T, 16, D, torch.bfloat16, "cuda")
    q, k, v, u = (x[n] for n in "qkvu")
    outs = {}
    for split in (False, True):
        triton_chunked.SPLIT_STATE_CHAIN[0] = split
        o, (S, _, z) = triton_chunked.chunked_vla(q, k, v, u, config=cfg)
        outs[split] = (o, S, z)
    report["agreement"][f"D{D}_T{T}"] = {
        n: rel(outs[True][i], outs[False][i]) for i, n in enumerate(("o", "S", "z"))
    }
    print("agreement", D, T, report["agreement"][f"D{D}_T{T}"], flush=True)
    qh, kh, vh = (a.transpose(1, 2).contiguous() for a in (q, k, v))

    def chunked(split: bool) -> torch.Tensor:
        triton_chunked.SPLIT_STATE_CHAIN[0] = split
        return triton_chunked.chunked_vla(q, k, v, u, config=cfg)[0]

    fns = {
        "vla_triton_chunked": lambda: chunked(False),
        "vla_triton_chunked_split": lambda: chunked(True),
        "sdpa": lambda: F.scaled_dot_product_attention(qh, kh, vh, is_causal=True),
    }
    try:
        from fla.ops.delta_rule import chunk_delta_rule

        beta = torch.ones(1, T, 16, device="cuda", dtype=q.dtype)
        qu, ku = x["q_unit"], x["k_unit"]
        fns["fla_chunk_delta"] = lambda: chunk_delta_rule(qu, ku, v, beta, scale=1.0)[0]
    except Exception as exc:  # fla missing: that row is absent
        print("fla missing", exc)
    for op, fn in fns.items():
        ms = time_ms(fn)
        report["records"].append(
            {"op": op, "B": 1, "T": T, "H": 16, "D": D, "dtype": "bfloat16", "mode": "fwd",
             "median_ms": ms}
        )  # fmt: skip
        print(report["records"][-1], flush=True)


def main() -> None:
    out_dir = Path(sys.argv[1])
    cfg = VLAConfig()
    report: dict = {"provenance": provenance("cuda"), "agreement": {}, "records": []}
    path = out_dir / "state_chain_split.json"
    triton_chunked.SPLIT_STATE_CHAIN[0] = True
    for dk in (64, 128):
        # The checker's default reach at key widths up to dk, the split state chain.
        r = validate(
            backends.get("triton_chunked"), config=cfg, array="torch", dtype="bfloat16",
            device="cuda", max_examples=6, seed=dk, max_dk=dk,
        )  # fmt: skip
        report["agreement"][f"validate_bf16_paper_dk{dk}"] = r.passed
        print("validate", dk, r.passed, r.worst_ratio, flush=True)
    for D in (64, 128):
        for T in (4096, 16384, 65536):
            measure(D, T, cfg, report)
            path.write_text(json.dumps(report, indent=1) + "\n")
            torch.cuda.empty_cache()
    from torch.profiler import ProfilerActivity, profile

    x = _inputs(1, 16384, 16, 64, torch.bfloat16, "cuda")
    triton_chunked.SPLIT_STATE_CHAIN[0] = True
    triton_chunked.chunked_vla(x["q"], x["k"], x["v"], x["u"], config=cfg)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            triton_chunked.chunked_vla(x["q"], x["k"], x["v"], x["u"], config=cfg)
        torch.cuda.synchronize()
    report["breakdown_D64_T16384_ms"] = {
        e.key[:80]: e.self_device_time_total / 5e3
        for e in prof.key_averages()
        if e.self_device_time_total > 0
    }
    path.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report["breakdown_D64_T16384_ms"], indent=1))


if __name__ == "__main__":
    main()
