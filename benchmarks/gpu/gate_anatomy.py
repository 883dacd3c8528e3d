"""Where the gate kernel's time per token goes (issue 5): time stripped-down variants of the
penalty-chain loop on the H200, side by side with fla's fused_recurrent_dplr_delta_rule.

    python benchmarks/gpu/gate_anatomy.py   # on the GPU (~2 min); writes $OUT/gate_anatomy.json
    TRITON_INTERPRET=1 python benchmarks/gpu/gate_anatomy.py --smoke   # CPU: the variants run

The kernel below is NOT the backend's (``vla_verify.backends.triton_fused_kernels``): it is an
experiment that switches parts of the spec §2.3 gate step on and off with ``constexpr`` flags,
so that the difference of two rows is the cost of one part.  Outputs are written (or not) but
never checked here; only the timing matters.  Flags:

- ``ALPHA``: the gate ``α = A_t k̂`` and ``(‖α‖², αᵀq)`` (off: the chain ``s, δ, A`` only);
- ``KEY``: ``k̂ = k/‖k‖`` and ``z_tᵀq`` (off: ``k`` used as ``k̂``);
- ``NUDGE``: the branch-free ``A + η I`` select over the tile (off: no nudge);
- ``STORE``: the per-token stores of ``k̂, α̂`` and two scalars;
- ``PIPE``: ``s_{t+1} = A_t u_{t+1}`` paired with ``α_t`` (two dependent reductions per token);
- ``PREF2``: with ``PIPE``, ``u`` prefetched two tokens ahead (else it is loaded in the same
  iteration that uses it);
- ``SPLIT``: sums down axis 0 as 4 interleaved partial sums (shorter dependent add chains).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from pathlib import Path

import triton
import triton.language as tl


@triton.jit
def _add2(a0, b0, a1, b1):
    return a0 + a1, b0 + b1


@triton.jit
def _add3(a0, b0, c0, a1, b1, c1):
    return a0 + a1, b0 + b1, c0 + c1


@triton.jit
def _colsum2(a, b, BK: tl.constexpr, SPLIT: tl.constexpr):
    if SPLIT:
        ra = tl.reshape(a, [4, BK // 4, BK])
        rb = tl.reshape(b, [4, BK // 4, BK])
        pa, pb = tl.reduce((ra, rb), 1, _add2)
        return tl.reduce((pa, pb), 0, _add2)
    else:
        return tl.reduce((a, b), 0, _add2)


@triton.jit
def anatomy_kernel(
    q_ptr, k_ptr, u_ptr, kh_ptr, ah_ptr, sc_ptr, T, H, nudge_period,
    BK: tl.constexpr, ALPHA: tl.constexpr, KEY: tl.constexpr, NUDGE: tl.constexpr,
    STORE: tl.constexpr, PIPE: tl.constexpr, PREF2: tl.constexpr, SPLIT: tl.constexpr,
):  # fmt: skip
    i_bh = tl.program_id(0).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    ok = tl.arange(0, BK)
    eye = ok[:, None] == ok[None, :]
    A = tl.where(eye, 10.0, 0.0)
    z = tl.zeros([BK], dtype=tl.float32)
    base = (i_b * T * H + i_h) * BK
    stride = H * BK
    q_n = tl.load(q_ptr + base + ok).to(tl.float32)
    k_n = tl.load(k_ptr + base + ok).to(tl.float32)
    u_n = tl.load(u_ptr + base + ok).to(tl.float32)
    u_nn = tl.load(u_ptr + base + tl.minimum(1, T - 1) * stride + ok).to(tl.float32)
    s_p = tl.sum(A * u_n[:, None], axis=0)
    dr_p = 1.0 + tl.sum(u_n * s_p, axis=0)
    for t in range(T):
        q = q_n
        k = k_n
        u = u_n
        nk = base + tl.minimum(t + 1, T - 1) * stride
        q_n = tl.load(q_ptr + nk + ok).to(tl.float32)
        k_n = tl.load(k_ptr + nk + ok).to(tl.float32)
        if PIPE and PREF2:
            u_n = u_nn
            u_nn = tl.load(u_ptr + base + tl.minimum(t + 2, T - 1) * stride + ok).to(tl.float32)
        else:
            u_n = tl.load(u_ptr + nk + ok).to(tl.float32)
        if KEY:
            z = z + k
            kk, zq = tl.reduce((k * k, z * q), 0, _add2)
            kh = k / tl.maximum(tl.sqrt_rn(kk), 1e-12)
        else:
            kh = k
            zq = 0.0
        if PIPE:
            s = s_p
            dr = dr_p
        else:
            s = tl.sum(A * u[:, None], axis=0)
            dr = 1.0 + tl.sum(u * s, axis=0)
        rd = 1.0 / tl.maximum(dr, 1e-4)
        A = tl.fma(-(s[:, None] * s[None, :]), rd, A)
        if NUDGE:
            eta = tl.where((t + 1) % nudge_period == 0, 1e-3, 0.0)
            A = A + tl.where(eye, eta, 0.0)
        if PIPE:
            if ALPHA:
                alpha, s_p = _colsum2(A * kh[:, None], A * u_n[:, None], BK, SPLIT)
                aa, aq, us = tl.reduce((alpha * alpha, alpha * q, u_n * s_p), 0, _add3)
            else:
                s_p = tl.sum(A * u_n[:, None], axis=0)
                us = tl.sum(u_n * s_p, axis=0)
                alpha = s_p
                aa = us
                aq = us
            dr_p = 1.0 + us
        elif ALPHA:
            alpha, _unused = _colsum2(A * kh[:, None], A * kh[:, None], BK, SPLIT)
            aa, aq = tl.reduce((alpha * alpha, alpha * q), 0, _add2)
        else:
            alpha = s
            aa = dr
            aq = dr
        if STORE:
            rn = 1.0 / tl.maximum(tl.sqrt_rn(aa), 1e-12)
            tl.store(kh_ptr + (i_bh * T + t) * BK + ok, kh)
            tl.store(ah_ptr + (i_bh * T + t) * BK + ok, alpha * rn)
            tl.store(sc_ptr + (i_bh * T + t) * 2, aq * rn)
            tl.store(sc_ptr + (i_bh * T + t) * 2 + 1, zq)
    tl.store(ah_ptr + i_bh * T * BK + ok, tl.sum(A, axis=0))  # keep the chain live


_FLAGS = ("ALPHA", "KEY", "NUDGE", "STORE", "PIPE", "PREF2", "SPLIT")
VARIANTS = [  # (name, flags in the order of _FLAGS)
    ("full (backend-like)", (1, 1, 1, 1, 0, 0, 0)),
    ("full, pipelined", (1, 1, 1, 1, 1, 0, 0)),
    ("full, pipelined, u 2 ahead", (1, 1, 1, 1, 1, 1, 0)),
    ("full, pipelined, u 2 ahead, split sums", (1, 1, 1, 1, 1, 1, 1)),
    ("full, split sums", (1, 1, 1, 1, 0, 0, 1)),
    ("no nudge", (1, 1, 0, 1, 0, 0, 0)),
    ("no key", (1, 0, 1, 1, 0, 0, 0)),
    ("no stores", (1, 1, 1, 0, 0, 0, 0)),  # α, k̂ and their sums are then dead code
    ("chain + alpha only", (1, 0, 0, 0, 0, 0, 0)),  # idem: the same kernel as "chain only"
    ("chain only", (0, 0, 0, 0, 0, 0, 0)),
    ("chain only, pipelined, u 2 ahead", (0, 0, 0, 0, 1, 1, 0)),
]


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU interpreter")
    args = ap.parse_args()
    dev = "cpu" if args.smoke else "cuda"
    T, BH = (8, 2) if args.smoke else (4096, 16)
    dims = ((16, 1),) if args.smoke else ((64, 2), (64, 1), (64, 4), (128, 4), (128, 8))
    rows = []
    if not args.smoke:
        from triton.testing import do_bench
    for D, nw in dims:
        g = torch.Generator(device="cpu").manual_seed(0)
        q, k, u = (torch.randn(1, T, BH, D, generator=g).to(dev, torch.bfloat16) for _ in range(3))
        u = u / (u.float().norm(dim=-1, keepdim=True) * D**0.5).to(u.dtype)
        kh = torch.empty(BH, T, D, device=dev)
        ah = torch.empty(BH, T, D, device=dev)
        sc = torch.empty(BH, T, 2, device=dev)
        for name, bits in VARIANTS:
            if nw != 2 and D == 64 and not name.startswith(("full", "chain only")):
                continue
            flags = dict(zip(_FLAGS, bits, strict=True))
            run = functools.partial(
                anatomy_kernel[(BH,)], q, k, u, kh, ah, sc, T, BH, 20, BK=D, num_warps=nw, **flags
            )

            try:
                run()
                ms = 0.0 if args.smoke else do_bench(run, warmup=50, rep=300)
            except Exception as exc:  # a variant that fails to compile is reported, not fatal
                print(f"D={D} nw={nw} {name}: FAILED {type(exc).__name__}: {exc}"[:300], flush=True)
                continue
            rows.append(dict(D=D, num_warps=nw, T=T, BH=BH, variant=name, flags=flags,
                             median_ms=ms, us_per_token=1e3 * ms / T))  # fmt: skip
            print(f"D={D:4d} nw={nw} {name:42s} {ms:8.3f} ms  {1e3 * ms / T:6.3f} us/token",
                  flush=True)  # fmt: skip
    anchors = []
    if not args.smoke:
        try:
            from fla.ops.generalized_delta_rule import fused_recurrent_dplr_delta_rule as dplr

            for D in (64, 128):
                g = torch.Generator(device="cpu").manual_seed(1)
                x = [torch.randn(1, T, 16, D, generator=g).to(dev) for _ in range(3)]
                qq, kk = (torch.nn.functional.normalize(y, dim=-1).bfloat16() for y in x[:2])
                vv = x[2].bfloat16()
                gk = torch.zeros(qq.shape, device=dev, dtype=torch.float32)  # as vla_verify.bench
                call = functools.partial(dplr, qq, kk, vv, -kk, kk.clone(), gk, scale=1.0)
                ms = do_bench(call, warmup=50, rep=300)
                anchors.append(dict(op="fla_fused_recurrent_dplr", D=D, T=T, H=16, median_ms=ms,
                                    us_per_token=1e3 * ms / T))  # fmt: skip
                print(f"D={D:4d} fla dplr {ms:8.3f} ms  {1e3 * ms / T:6.3f} us/token")
        except Exception as exc:
            print(f"fla anchor not run: {type(exc).__name__}: {exc}")
    out = Path(os.environ.get("OUT", "."))
    gpu = torch.cuda.get_device_name() if dev == "cuda" else "cpu (interpreter)"
    info = dict(torch=torch.__version__, triton=triton.__version__, gpu=gpu)
    (out / "gate_anatomy.json").write_text(
        json.dumps(dict(machine=info, rows=rows, anchors=anchors), indent=1)
    )


if __name__ == "__main__":
    sys.exit(main())
