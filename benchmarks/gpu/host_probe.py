"""The host's work per call of the chunked forward, by section, on a GPU.

The chunked forward's eager time is the host's where the host takes longer than the device
(``docs/design/triton_chunked.md``, "The host's work").  For each size (B = 1, H = 16, bf16,
paper preset) this measures, after a warm-up:

- ``host_ms``: the host's time per call, 30 calls issued back to back without waiting for the
  device (the device's queue is deep enough that the host never blocks on it here), and
  ``wall_ms``, the same calls until the device is done;
- ``sections_us``: the host's time per call in the package's functions, in each Triton launch
  and in ``torch.linalg.solve_ex`` (``perf_counter`` around each, over 30 more calls).

Usage (the package first on ``PYTHONPATH``; ``--label`` names the tree measured, so that two
trees can be measured side by side in one run)::

    python benchmarks/gpu/host_probe.py --out DIR [--label NAME] [--commit SHA]

writes ``DIR/host_probe_<label>.json``.
"""

from __future__ import annotations

import argparse
import collections
import json
import time
from pathlib import Path
from typing import Any

SIZES = ((64, 1024), (64, 4096), (64, 16384), (128, 4096))
CALLS = 30


def main() -> None:
    import torch

    from vla_verify import VLAConfig
    from vla_verify.backends import triton_chunked as tc
    from vla_verify.bench import _inputs, machine_info

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--label", default="tree")
    ap.add_argument("--commit", default="unknown")
    a = ap.parse_args()
    spent: dict[str, float] = collections.defaultdict(float)
    calls: collections.Counter[str] = collections.Counter()

    def timed(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - t
                calls[name] += 1

        return wrapper

    class TimedKernel:
        def __init__(self, name: str, kernel: Any) -> None:
            self.name, self.kernel = name, kernel

        def __getitem__(self, grid: Any) -> Any:
            return timed("launch:" + self.name, self.kernel[grid])

    cfg = VLAConfig()
    out: dict[str, Any] = {"machine": {**machine_info(), "commit": a.commit}, "label": a.label,
                           "calls": CALLS, "sizes": {}}  # fmt: skip
    for D, T in SIZES:
        x = _inputs(1, T, 16, D, torch.bfloat16, "cuda")

        def forward(x: dict[str, Any] = x) -> Any:
            return tc.chunked_vla(x["q"], x["k"], x["v"], x["u"], config=cfg)

        for _ in range(3):
            forward()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(CALLS):
            forward()
        host = (time.perf_counter() - t) / CALLS
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t) / CALLS
        # Sections: the package's functions, the launches and the solve, each wrapped.
        originals: list[tuple[Any, str, Any]] = []
        for name in ("penalty_block_starts", "penalty_block_matrices"):
            if hasattr(tc, name):
                originals.append((tc, name, getattr(tc, name)))
        for name in dir(tc.kernels):
            if name.endswith("_kernel"):
                originals.append((tc.kernels, name, getattr(tc.kernels, name)))
        originals.append((torch.linalg, "solve_ex", torch.linalg.solve_ex))
        for owner, name, fn in originals:
            wrapped = TimedKernel(name, fn) if owner is tc.kernels else timed(name, fn)
            setattr(owner, name, wrapped)
        spent.clear()
        calls.clear()
        t = time.perf_counter()
        for _ in range(CALLS):
            forward()
        spent["all"] = time.perf_counter() - t
        torch.cuda.synchronize()
        for owner, name, fn in originals:
            setattr(owner, name, fn)
        row = {
            "D": D, "T": T, "host_ms": host * 1e3, "wall_ms": wall * 1e3,
            "sections_us": {k: v / CALLS * 1e6
                            for k, v in sorted(spent.items(), key=lambda kv: -kv[1])},
            "calls_per_call": {k: v / CALLS for k, v in calls.items()},
        }  # fmt: skip
        print(json.dumps({k: v for k, v in row.items() if k != "calls_per_call"}), flush=True)
        out["sizes"][f"D{D}_T{T}"] = row
        del x
        torch.cuda.empty_cache()
    path = Path(a.out) / f"host_probe_{a.label}.json"
    path.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
