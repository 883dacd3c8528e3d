"""The chunked kernel's forward and forward + backward with one kernel at a time launched with
other warps than the backend's, side by side with the backend's launches.

Every Triton kernel of ``triton_chunked_kernels`` and ``triton_fused_kernels`` is wrapped so
that its launches are recorded (name, warps, stages) and, for one kernel at a time, launched
with other settings.  Correctness first: each variant's ``o`` and gradients against the
backend's own, then the medians (``vla_verify.bench.time_ms``, each taken twice and the lower
kept; the backend's launches timed before and after the variants, so that drift shows)::

    python benchmarks/gpu/launch_warps.py OUT.json [--sizes 64x16384 128x16384]
        [--kernels NAME ...] [--warps 2 4 8] [--set maxnreg=none ...]

B = 1, H = 16, bf16, the paper preset.  The agreement bound: the outputs and gradients are
bf16, and another launch shape sums the same float32 products in another order, which moves a
result by a few float32 roundings and so its bf16 rounding by at most one unit in the last
place; :data:`AGREE_RTOL` is two such units at the tensor's largest entry.  A variant that
fails to build (shared memory, registers) is recorded with its error.  ``--smoke`` runs toy
sizes on the CPU under ``TRITON_INTERPRET=1`` (correctness only, warps have no effect there).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

#: Two bf16 units in the last place at the tensor's largest entry (bf16 keeps 8 bits).
AGREE_RTOL = 2.0**-7


class _Launches:
    """Records every launch of the wrapped kernels and applies ``override`` (keyword
    arguments of the launch: ``num_warps``, or a planted ``BUG`` for the check's own test) to
    the launches of the kernel named ``target``."""

    def __init__(self) -> None:
        self.seen: dict[str, set[tuple[Any, Any]]] = {}
        self.target: str | None = None
        self.override: dict[str, Any] = {}


class _Wrapped:
    def __init__(self, fn: Any, name: str, launches: _Launches) -> None:
        self._fn, self._name, self._launches = fn, name, launches

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        launch = self._fn[grid]

        def call(*args: Any, **kw: Any) -> Any:
            rec = self._launches
            rec.seen.setdefault(self._name, set()).add(
                (kw.get("num_warps", 4), kw.get("num_stages", 3))
            )
            if rec.target == self._name:
                kw.update(rec.override)
            return launch(*args, **kw)

        return call

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._fn, attr)


@contextmanager
def instrumented() -> Iterator[_Launches]:
    """Every launched kernel (``*_kernel``; the helpers they call stay as they are) of the two
    kernel modules wrapped for the block's duration (under ``TRITON_INTERPRET=1`` they are the
    interpreter's functions)."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    from vla_verify.backends import triton_chunked_kernels, triton_fused_kernels

    launches = _Launches()
    saved: list[tuple[Any, str, Any]] = []
    for mod in (triton_chunked_kernels, triton_fused_kernels):
        for name, obj in list(vars(mod).items()):
            if name.endswith("_kernel") and isinstance(obj, JITFunction | InterpretedFunction):
                saved.append((mod, name, obj))
                setattr(mod, name, _Wrapped(obj, name, launches))
    try:
        yield launches
    finally:
        for mod, name, obj in saved:
            setattr(mod, name, obj)


def _relative_difference(a: Any, b: Any) -> float:
    scale = float(b.float().abs().amax())
    return float((a.float() - b.float()).abs().amax()) / max(scale, 1e-30)


def sweep(
    D: int, T: int, device: str, *, warps: list[int], only: list[str] | None, timing: bool,
    override: dict[str, Any] | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """One size: the backend's launches recorded, then each kernel (``only``, else every one
    launched) with each other ``warps``, or with ``override`` instead where given (the
    check's own test plants a fault this way).  ``options`` (other launch options, e.g.
    ``{"maxnreg": None}`` to lift a register cap) go with every other ``warps``, and alone with
    the backend's warps.  ``progress`` receives the partial result after every variant, so that
    a run cut short keeps what it measured."""
    import torch

    from vla_verify import VLAConfig
    from vla_verify.backends.triton_chunked import chunked_vla
    from vla_verify.bench import _grad_op, _inputs, time_ms

    cfg = VLAConfig()
    H = 2 if device == "cpu" else 16
    x = _inputs(1, T, H, D, torch.bfloat16, device)
    args = [x[n] for n in "qkvu"]

    def run() -> list[Any]:
        leaves = [a.detach().clone().requires_grad_(True) for a in args]
        o = chunked_vla(*leaves, config=cfg)[0]
        o.backward(x["do"])
        return [o.detach()] + [lf.grad for lf in leaves]

    def fwd() -> Any:
        return chunked_vla(*args, config=cfg)[0]

    def forward(q: Any, k: Any, v: Any, u: Any) -> Any:
        return chunked_vla(q, k, v, u, config=cfg)[0]

    # As the grid and chunked_timings.py time forward + backward.
    fwdbwd = _grad_op(forward, [a.detach().clone().requires_grad_(True) for a in args], x["do"])

    def medians() -> dict[str, float]:
        modes = (("fwd", fwd), ("fwdbwd", fwdbwd))
        return {f"{m}_ms": min(time_ms(f), time_ms(f)) for m, f in modes}

    out: dict[str, Any] = {"D": D, "T": T, "H": H, "variants": []}
    with instrumented() as launches:
        ref = run()
        out["launches"] = {k: sorted(v) for k, v in launches.seen.items()}
        if timing:
            out["backend_before"] = medians()
        names = only or sorted(launches.seen)
        for name in names:
            defaults = {w for w, _ in launches.seen.get(name, set())}
            extra = dict(options or {})
            trials = [override] if override is not None else [
                {"num_warps": w, **extra} for w in warps if w not in defaults
            ] + ([extra] if extra else [])  # fmt: skip
            for ov in trials:
                row: dict[str, Any] = {"kernel": name, "backend": sorted(defaults),
                                       "override": ov}  # fmt: skip
                launches.target, launches.override = name, dict(ov)
                try:
                    got = run()
                except Exception as exc:  # a build failure is a result
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                else:
                    diffs = [_relative_difference(g, r) for g, r in zip(got, ref, strict=True)]
                    row["relative_difference"] = dict(zip(["o", "dq", "dk", "dv", "du"], diffs,
                                                          strict=True))  # fmt: skip
                    row["agrees"] = max(diffs) <= AGREE_RTOL
                    if timing and row["agrees"]:
                        row.update(medians())
                launches.target, launches.override = None, {}
                out["variants"].append(row)
                print(json.dumps(row), flush=True)
                if progress is not None:
                    progress(out)
                if "illegal memory access" in row.get("error", ""):
                    # The CUDA context is lost: nothing after this in the process can run.
                    out["stopped"] = f"{name} {ov}: the CUDA context is lost"
                    return out
        if timing:
            out["backend_after"] = medians()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--sizes", nargs="+", default=["64x16384", "128x16384"])
    ap.add_argument("--kernels", nargs="+", default=None)
    ap.add_argument("--warps", nargs="+", type=int, default=[2, 4, 8])
    ap.add_argument(
        "--set",
        nargs="+",
        default=[],
        metavar="OPTION=VALUE",
        help="launch options with every variant (an integer, or none)",
    )
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    options = {}
    for item in a.set:
        key, _, value = item.partition("=")
        if not key or not value:
            ap.error(f"--set takes OPTION=VALUE, got {item!r}")
        options[key] = None if value.lower() == "none" else int(value)
    sizes = ["40x96"] if a.smoke else a.sizes
    device = "cpu" if a.smoke else "cuda"
    res: dict[str, Any] = {"agree_rtol": AGREE_RTOL, "sizes": []}
    if not a.smoke:
        from vla_verify.bench import machine_info

        res["machine"] = machine_info()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    for size in sizes:
        D, T = (int(s) for s in size.split("x"))
        done = list(res["sizes"])

        def write(partial: dict[str, Any], done: list[Any] = done) -> None:
            a.out.write_text(json.dumps({**res, "sizes": [*done, partial]}, indent=1))

        res["sizes"].append(sweep(D, T, device, warps=a.warps, only=a.kernels,
                                  timing=not a.smoke, progress=write,
                                  options=options))  # fmt: skip
        a.out.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
