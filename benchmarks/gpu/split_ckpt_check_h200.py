"""The streamed training forward at dk = 128 without an initial state (checkpoints stored, split
sums kept since 6ecc217) against one chain (``split_sums=1``) and both against the float64
PyTorch backend: gradients of one step, B = 1, T = 256, H = 2, float32, nudges every 7 tokens.

    python benchmarks/gpu/split_ckpt_check_h200.py --out $OUT   # split_ckpt_check.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=".")
    args = p.parse_args()
    import torch

    from vla_verify import VLAConfig, backends
    from vla_verify.backends.triton_fused import fused_recurrent_vla
    from vla_verify.bench import _inputs

    config = VLAConfig(nudge_period=7)
    x = _inputs(1, 256, 2, 128, torch.float32, "cuda", seed=3)
    ref = backends.get("torch")

    def grads(fn, dtype):  # type: ignore[no-untyped-def]
        xs = [x[n].to(dtype).detach().requires_grad_() for n in ("q", "k", "v", "u")]
        o = fn(*xs)
        return [g.double() for g in torch.autograd.grad(o, xs, x["do"].to(dtype))]

    want = grads(lambda *a: ref(*a, config=config)[0], torch.float64)
    rows = {}
    for name, split in (("split_default", None), ("one_chain", 1)):
        got = grads(
            lambda *a, s=split: fused_recurrent_vla(*a, config=config, split_sums=s)[0],
            torch.float32,
        )
        rows[name] = [
            float((g - w).abs().max() / w.abs().max()) for g, w in zip(got, want, strict=True)
        ]
    u = float(torch.finfo(torch.float32).eps) / 2
    passed = all(
        a <= 2 * b + u for a, b in zip(rows["split_default"], rows["one_chain"], strict=True)
    )
    result = {"rel_err_dq_dk_dv_du": rows, "passed": passed}
    print(json.dumps(result), flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "split_ckpt_check.json").write_text(json.dumps(result, indent=1))
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
