"""Validate every flash-linear-attention adapter on a GPU (issue 6; spec §4, §5).

Runs :func:`vla_verify.validate` on each adapter of :mod:`vla_verify.adapters.fla` in bfloat16
and float32 on CUDA, records per (adapter, dtype): the verdict (PASSED / FAILED / REFUSED with
the adapter's declared reason), the number of examples, the worst error/budget ratio on passing
examples, the time and, on failure, Hypothesis's shrunk counterexample.  Writes
``$OUT/fla_adapters.json`` (after every row, so a crash keeps what was done) and prints a table
last.

When a float32 chunk kernel fails, the same row is re-run in a subprocess with
``TRITON_F32_DEFAULT=ieee`` (Triton's ``tl.dot`` rounds float32 operands to TF32 by default on
sm_80+; fla's chunk kernels use ``tl.dot``), to tell a TF32 effect from an algorithmic one.

Usage (H200; fla-core is carried as a wheel, the image has einops)::

    pip install --no-deps .whl/fla_core-0.6.0-py3-none-any.whl
    python benchmarks/gpu/fla_adapters_h200.py                 # ~2-4 min, writes $OUT
    python benchmarks/gpu/fla_adapters_h200.py --smoke         # CPU, Triton interpreter

``--autotune first`` (default) restricts fla's Triton autotuners to the first configuration fla
lists for each kernel (the same kernel code at one block size), because full autotuning compiles
every configuration for every new head-dim bucket and dtype that Hypothesis draws (hundreds of
compilations); ``--autotune full`` keeps fla's autotuning.  The mode is recorded in the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ADAPTER_NAMES = (
    "fused_recurrent_delta",
    "chunk_delta",
    "fused_recurrent_iplr_vla",
    "chunk_iplr_vla",
    "fused_recurrent_dplr_vla",
    "chunk_dplr_vla",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="CPU through Triton's interpreter, tiny")
    p.add_argument("--max-examples", type=int, default=None, help="default 30 (smoke: 6)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-T", type=int, default=None, help="default 128 (smoke: 10)")
    p.add_argument("--max-d", type=int, default=None, help="largest dk, dv; default 64 (smoke: 6)")
    p.add_argument("--max-BH", type=int, default=2, help="largest B and H")
    p.add_argument("--dtypes", default="bfloat16,float32")
    p.add_argument("--only", default=None, help="comma-separated adapter names")
    p.add_argument("--autotune", choices=("first", "full"), default="first")
    p.add_argument("--no-ieee", action="store_true", help="no TRITON_F32_DEFAULT=ieee re-runs")
    p.add_argument("--tag", default="", help="label for the rows (used by the ieee re-run)")
    p.add_argument("--out", default=os.environ.get("OUT", "fla_adapters_out"))
    p.add_argument("--json-name", default="fla_adapters.json")
    return p.parse_args(argv)


ARGS = parse_args()
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
if ARGS.smoke:  # must precede the first import of triton
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")  # fla's Triton kernels, no vendor path

import torch  # noqa: E402

from vla_verify import VLAConfig, validate  # noqa: E402
from vla_verify.errors import VLAError  # noqa: E402
from vla_verify.properties.strategies import ShapeBounds  # noqa: E402


def restrict_autotuning() -> int:
    """Keep only the first configuration of every fla autotuner (``--autotune first``)."""
    import importlib

    from triton.runtime.autotuner import Autotuner

    for mod in (
        "fla.ops.delta_rule",
        "fla.ops.generalized_delta_rule",
        "fla.ops.delta_rule.fused_recurrent",
        "fla.ops.delta_rule.chunk",
        "fla.ops.generalized_delta_rule.iplr.fused_recurrent",
        "fla.ops.generalized_delta_rule.iplr.chunk",
        "fla.ops.generalized_delta_rule.dplr.fused_recurrent",
        "fla.ops.generalized_delta_rule.dplr.chunk",
    ):
        importlib.import_module(mod)
    count = 0
    for name, module in list(sys.modules.items()):
        if not name.startswith("fla.") or module is None:
            continue
        for obj in list(vars(module).values()):
            for _ in range(8):
                if isinstance(obj, Autotuner):
                    if "prune_configs" not in obj.__dict__:
                        original = obj.prune_configs
                        obj.prune_configs = lambda kw, _o=original: _o(kw)[:1]
                        count += 1
                    break
                obj = getattr(obj, "fn", None)
                if obj is None:
                    break
    return count


def environment(device: str, autotune: str) -> dict[str, Any]:
    import importlib.metadata as md

    def version(pkg: str) -> str | None:
        try:
            return md.version(pkg)
        except md.PackageNotFoundError:
            return None

    return {
        "device": device,
        "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
        "torch": torch.__version__,
        "triton": version("triton"),
        "fla-core": version("fla-core"),
        "vla-verify": version("vla-verify"),
        "autotune": autotune,
        "env": {
            k: os.environ.get(k)
            for k in ("TRITON_INTERPRET", "TRITON_F32_DEFAULT", "FLA_DISABLE_BACKEND_DISPATCH")
        },
    }


def config_for(variant: str) -> VLAConfig:
    # delta: the spec's read-out without the normaliser (o = S q); vla: the paper preset.
    return VLAConfig(normalize_output=False) if variant == "delta" else VLAConfig()


def run_row(
    name: str, dtype: str, device: str, bounds: ShapeBounds, args: argparse.Namespace
) -> dict[str, Any]:
    from vla_verify.adapters import fla as adapters

    adapter = adapters.ADAPTERS[name]
    config = config_for(adapter.variant)
    row: dict[str, Any] = {
        "adapter": name,
        "kernel": adapter.kernel().name,
        "variant": adapter.variant,
        "dtype": dtype,
        "tag": args.tag,
        "device": device,
        "config": {k: getattr(config, k) for k in config.__dataclass_fields__},
        "max_examples": args.max_examples,
        "seed": args.seed,
    }
    start = time.perf_counter()
    try:
        report = validate(
            adapter,
            config=config,
            variant=adapter.variant,
            array="torch",
            dtype=dtype,
            device=device,
            max_examples=args.max_examples,
            seed=args.seed,
            bounds=bounds,
        )
    except VLAError as exc:  # the adapter's declared refusal (dtype, interpreter, ...)
        row.update(verdict="REFUSED", reason=str(exc), seconds=time.perf_counter() - start)
        return row
    except Exception as exc:  # a bug of the harness, not a verdict on fla
        row.update(verdict="ERROR", reason=f"{type(exc).__name__}: {exc}")
        row["seconds"] = time.perf_counter() - start
        return row
    row.update(
        verdict="PASSED" if report.passed else "FAILED",
        examples=report.examples,
        rejected=report.rejected,
        worst_ratio=report.worst_ratio,
        seconds=report.elapsed_s,
    )
    if not report.passed:
        failure = report.failures[0]
        row["failure"] = {
            "kind": failure.kind,
            "message": failure.message,
            "input": failure.case.describe(),
            "report": failure.describe().splitlines()[:40],
            "comparisons": [
                {
                    "name": c.name,
                    "max_error": float(c.error.max()),
                    "budget_at_worst": float(c.budget.flat[int((c.error - c.budget).argmax())]),
                    "ratio": c.ratio,
                }
                for c in failure.comparisons
            ],
        }
        print(report.summary(), file=sys.stderr, flush=True)
    return row


def ieee_rerun(name: str, args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    """Re-run one float32 row in a subprocess with ``TRITON_F32_DEFAULT=ieee``."""
    json_name = f"fla_adapters_ieee_{name}.json"
    cmd = [
        sys.executable,
        __file__,
        "--only", name,
        "--dtypes", "float32",
        "--no-ieee",
        "--tag", "TRITON_F32_DEFAULT=ieee",
        "--autotune", args.autotune,
        "--max-examples", str(args.max_examples),
        "--seed", str(args.seed),
        "--max-T", str(args.max_T),
        "--max-d", str(args.max_d),
        "--max-BH", str(args.max_BH),
        "--out", str(out),
        "--json-name", json_name,
    ]  # fmt: skip
    env = {**os.environ, "TRITON_F32_DEFAULT": "ieee"}
    subprocess.run(cmd, env=env, check=False)
    path = out / json_name
    if not path.exists():
        return [{"adapter": name, "dtype": "float32", "tag": "TRITON_F32_DEFAULT=ieee",
                 "verdict": "ERROR", "reason": "the ieee re-run wrote no result"}]  # fmt: skip
    rows = json.loads(path.read_text())["rows"]
    path.unlink()
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    print()
    print("fla adapters against the float64 oracle (error budget of spec §4)")
    head = (
        f"{'adapter':<26} {'dtype':<9} {'verdict':<8} {'ex':>4} {'err/budget':>10} "
        f"{'time':>7}  note"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        ratio = r.get("worst_ratio")
        ratio_s = "-" if ratio is None else f"{ratio:.3g}"
        note = r.get("tag") or ""
        if r["verdict"] in ("REFUSED", "ERROR"):
            note = (note + " " + r.get("reason", "")).strip()
        elif r["verdict"] == "FAILED":
            f = r["failure"]
            note = (note + f" {f['kind']}: {f['message']} @ {f['input']}").strip()
        print(
            f"{r['adapter']:<26} {r['dtype']:<9} {r['verdict']:<8} {r.get('examples', 0):>4} "
            f"{ratio_s:>10} {r.get('seconds', 0.0):>6.1f}s  {note[:160]}"
        )


def main(args: argparse.Namespace) -> int:
    device = "cpu" if args.smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("no CUDA GPU here; use --smoke for the CPU interpreter run", file=sys.stderr)
        return 2
    args.max_examples = args.max_examples or (6 if args.smoke else 30)
    args.max_T = args.max_T or (10 if args.smoke else 128)
    args.max_d = args.max_d or (6 if args.smoke else 64)
    bounds = ShapeBounds(
        max_B=args.max_BH, max_H=args.max_BH, max_T=args.max_T, max_dk=args.max_d,
        max_dv=args.max_d,
    )  # fmt: skip
    autotune = args.autotune
    if autotune == "first" and device == "cuda":
        restrict_autotuning()
    if device == "cpu":
        autotune = "interpreter (first config of autotuned fused kernels; see adapters.fla)"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = args.only.split(",") if args.only else list(ADAPTER_NAMES)
    dtypes = args.dtypes.split(",")
    result: dict[str, Any] = {
        "environment": environment(device, autotune),
        "bounds": bounds.__dict__,
        "rows": [],
    }
    path = out / args.json_name
    t0 = time.perf_counter()
    for name in names:
        for dtype in dtypes:
            print(f"[{time.perf_counter() - t0:6.1f}s] {name} {dtype} ...", flush=True)
            row = run_row(name, dtype, device, bounds, args)
            result["rows"].append(row)
            path.write_text(json.dumps(result, indent=1, default=str))
            if (
                row["verdict"] == "FAILED"
                and dtype == "float32"
                and name.startswith("chunk")
                and device == "cuda"
                and not args.no_ieee
            ):
                print(f"[{time.perf_counter() - t0:6.1f}s] {name} float32 ieee ...", flush=True)
                result["rows"].extend(ieee_rerun(name, args, out))
                path.write_text(json.dumps(result, indent=1, default=str))
    result["total_seconds"] = time.perf_counter() - t0
    path.write_text(json.dumps(result, indent=1, default=str))
    print_table(result["rows"])
    print(f"\nwrote {path} ({result['total_seconds']:.0f} s)")
    return 1 if any(r["verdict"] in ("FAILED", "ERROR") for r in result["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main(ARGS))
