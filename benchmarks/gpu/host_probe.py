"""The host's work per call of the chunked forward, by section, on a GPU.

The chunked forward's eager time is the host's where the host takes longer than the device
(``docs/design/triton_chunked.md``, "The host's work").  For each size (B = 1, H = 16, bf16,
paper preset) this measures, after a warm-up:

- ``host_ms``: the host's time per call, 30 calls issued back to back without waiting for the
  device (the device's queue is deep enough that the host never blocks on it here), and
  ``wall_ms``, the same calls until the device is done;
- ``sections_us``: the host's time per call in the package's functions, in each Triton launch
  and in ``torch.linalg.solve_ex`` (``perf_counter`` around each, over 30 more calls);
- with ``--launch-paths``, ``launch_paths_us``: for each Triton launch of one call, the host's
  time per launch through Triton's JIT path (``kernel[grid](...)``: binding, specialisation,
  the cache's key) against the compiled kernel called directly (``compiled[grid](...)`` with
  the bound arguments, the stream looked up or given): what a launch cache would save.

Usage (the package first on ``PYTHONPATH``; ``--label`` names the tree measured)::

    python benchmarks/gpu/host_probe.py --out DIR [--label NAME] [--commit SHA]

writes ``DIR/host_probe_<label>.json``.  Host times differ between processes on one machine (a
launch whose code is the same took up to 1.9 times longer in one process than in the next), so
to compare trees, alternate them::

    python benchmarks/gpu/host_probe.py --out DIR --trees NEW_ROOT OLD_ROOT --rounds 3

runs the probe for each tree (its root put first on ``PYTHONPATH``) in a fresh process, tree
after tree, ``--rounds`` times, and writes every round and each tree's median per size to
``DIR/host_compare.json``.
"""

from __future__ import annotations

import argparse
import collections
import json
import time
from functools import partial
from pathlib import Path
from typing import Any

SIZES = ((64, 1024), (64, 4096), (64, 16384), (128, 4096))
CALLS = 30


def compare(out: Path, trees: list[str], rounds: int) -> None:
    """The probe for each of ``trees`` in a fresh process, tree after tree, ``rounds`` times;
    ``host_compare.json`` holds every round and each tree's median ``host_ms`` and ``wall_ms``
    per size."""
    import os
    import statistics
    import subprocess
    import sys

    runs: dict[str, list[dict[str, Any]]] = {tree: [] for tree in trees}
    for r in range(rounds):
        for i, tree in enumerate(trees):
            label = f"tree{i}_round{r}"
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(
                [str(Path(tree).resolve()), os.environ.get("PYTHONPATH", "")]))  # fmt: skip
            subprocess.run([sys.executable, __file__, "--out", str(out), "--label", label],
                           env=env, check=True)  # fmt: skip
            path = out / f"host_probe_{label}.json"
            runs[tree].append(json.loads(path.read_text()))
            path.unlink()
    medians = {
        tree: {size: {key: statistics.median(run["sizes"][size][key] for run in done)
                      for key in ("host_ms", "wall_ms")}
               for size in done[0]["sizes"]}
        for tree, done in runs.items()
    }  # fmt: skip
    (out / "host_compare.json").write_text(
        json.dumps({"trees": trees, "rounds": rounds, "medians": medians, "runs": runs}, indent=1)
    )
    print(json.dumps(medians, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--label", default="tree")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--trees", nargs="+", default=None, help="roots of trees to alternate")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--launch-paths", action="store_true", help="time each launch's two paths")
    a = ap.parse_args()
    if a.trees:
        compare(Path(a.out), a.trees, a.rounds)
    else:
        probe(Path(a.out), a.label, a.commit, a.launch_paths)


def launch_paths(forward: Any, kernels: Any, reps: int = 200) -> dict[str, dict[str, float]]:
    """The host's microseconds per launch of each Triton kernel of one ``forward()`` call
    through the JIT path and through the compiled kernel called directly (module ``kernels``
    holds the kernels; each is wrapped while one call records its launches)."""
    import torch
    from triton.runtime import driver

    records: list[tuple[str, Any, tuple[int, ...], tuple[Any, ...], dict[str, Any], Any]] = []

    class Recorder:
        def __init__(self, name: str, kernel: Any) -> None:
            self.name, self.kernel = name, kernel

        def __getitem__(self, grid: Any) -> Any:
            def launch(*args: Any, **kwargs: Any) -> Any:
                compiled = self.kernel[grid](*args, **kwargs)
                records.append((self.name, self.kernel, tuple(grid), args, kwargs, compiled))
                return compiled

            return launch

    names = [n for n in dir(kernels) if n.endswith("_kernel")]
    originals = {n: getattr(kernels, n) for n in names}
    for n in names:
        setattr(kernels, n, Recorder(n, originals[n]))
    try:
        forward()
    finally:
        for n in names:
            setattr(kernels, n, originals[n])
    torch.cuda.synchronize()
    device = driver.active.get_current_device()
    stream = driver.active.get_current_stream(device)
    result: dict[str, dict[str, float]] = {}
    for i, (name, kernel, grid, args, kwargs, compiled) in enumerate(records):
        binder = kernel.device_caches[device][4]
        bound = list(binder(*args, **kwargs)[0].values())
        runner = compiled[(*tuple(grid), 1, 1)[:3]]
        result[f"{i:02d}:{name}"] = {
            "jit": _per_call_us(partial(kernel[grid], *args, **kwargs), reps),
            "direct": _per_call_us(partial(runner, *bound), reps),
            "direct_stream_given": _per_call_us(partial(runner, *bound, stream=stream), reps),
        }
    paths = ("jit", "direct", "direct_stream_given")
    result["sum"] = {p: sum(r[p] for r in result.values()) for p in paths}
    return result


def _per_call_us(call: Any, reps: int) -> float:
    """The host's microseconds per ``call()``, ``reps`` calls issued back to back after one."""
    import torch

    call()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        call()
    host = (time.perf_counter() - t) / reps * 1e6
    torch.cuda.synchronize()
    return host


def probe(out_dir: Path, label: str, commit: str, paths: bool = False) -> None:
    import torch

    from vla_verify import VLAConfig
    from vla_verify.backends import triton_chunked as tc
    from vla_verify.bench import _inputs, machine_info

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
    out: dict[str, Any] = {"machine": {**machine_info(), "commit": commit}, "label": label,
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
        if paths:
            row["launch_paths_us"] = launch_paths(forward, tc.kernels)
        print(json.dumps({k: v for k, v in row.items() if k != "calls_per_call"}), flush=True)
        out["sizes"][f"D{D}_T{T}"] = row
        del x
        torch.cuda.empty_cache()
    path = out_dir / f"host_probe_{label}.json"
    path.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
