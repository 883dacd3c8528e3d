"""Where the chunked gate kernel's time goes, on the H200: the gate pass alone, with parts skipped.

    python benchmarks/gpu/chunk_gate_anatomy.py --commit SHA --out $OUT   # chunk_gate_anatomy.json

:func:`~vla_verify.backends.triton_chunk_gate_kernels.vla_gate_chunk_kernel` takes ``ANATOMY``, a
bit mask used only here: 1 skips the LDLᵀ recursion (``L = I``, ``d = 1``), 2 the ``L^{-1}``
products, 4 the update of ``A``, 8 the products of the chunk (``Y``, ``KA``, ``G``, ``W``, ``α``
become the loaded tiles).  A skipped part leaves wrong numbers, so this times the kernel only
(outputs are not checked; the full kernel's correctness is ``chunk_gate_h200.py``'s).  Medians of
``triton.testing.do_bench`` of one gate pass over B = 1, H = 16, T = 4096, bf16, per (D, C,
warps); the recurrent gate kernel's time at the same shape is in ``two_pass_sweeps/run8``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--commit", default="")
    p.add_argument("--out", default=".")
    p.add_argument("--T", type=int, default=4096)
    cli = p.parse_args()
    import torch
    import triton
    import triton.language as tl

    from vla_verify import VLAConfig
    from vla_verify.backends import triton_chunk_gate_kernels as ck
    from vla_verify.backends.triton_fused import _NEVER, _params
    from vla_verify.bench import _inputs, machine_info, time_ms

    B, H, T = 1, 16, cli.T
    config = VLAConfig()
    rows = []
    for D, C, warps in ((64, 16, 8), (128, 16, 8)):
        x = _inputs(B, T, H, D, torch.bfloat16, "cuda")
        q, k, u = x["q"], x["k"], x["u"]
        bk, bkb = D, min(D, 32)
        kh = torch.empty(B * H, T, bk, device="cuda")
        ah = torch.empty_like(kh)
        sc = torch.empty(B * H, T, 2, device="cuda")
        aT = torch.empty(B, H, D, D, device="cuda")
        zT = torch.empty(B, H, D, device="cuda")
        a_scr = torch.empty(B * H, 2, bk, bk, dtype=torch.float64, device="cuda")
        w_scr = torch.empty(B * H, 3, C, bk, dtype=torch.float64, device="cuda")
        params = _params(config, torch.float32, q.device)
        args = (
            q, k, u, kh, ah, sc, aT, zT, aT, zT, aT, zT, a_scr, w_scr, params,
            T, H, D, config.nudge_period or _NEVER, 64, triton.cdiv(T, 64), 0, T,
        )  # fmt: skip
        kw = {"BK": bk, "C": C, "LOG2C": C.bit_length() - 1, "BKB": bkb, "HAS_INIT": False,
              "SAVE_CKPT": False, "NORM_GATE": True, "ACC": tl.float32,
              "num_warps": warps}  # fmt: skip
        for anatomy in (0, 1, 2, 4, 8):

            def run(anatomy: int = anatomy, args: tuple = args, kw: dict = kw) -> None:
                ck.vla_gate_chunk_kernel[(B * H,)](*args, ANATOMY=anatomy, **kw)

            run()
            torch.cuda.synchronize()
            ms = time_ms(run)
            row = {"D": D, "C": C, "warps": warps, "anatomy": anatomy, "median_ms": ms}
            rows.append(row)
            print(json.dumps(row), flush=True)
    out = Path(cli.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"machine": {**machine_info(), "commit": cli.commit}, "T": T, "rows": rows}
    (out / "chunk_gate_anatomy.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
