"""The ``vla-verify`` command line.

Subcommands
-----------
``check MODULE:FUNC``  validate your implementation against the oracle (exit 0 passed, 1 failed,
                       2 usage error), printing Hypothesis's shrunk counterexample on failure.
``backends``           the registry table: every backend, whether it runs here, and why not.
``run``                the main job: every available backend against the oracle (conformance),
                       then the claims ledger, as one report.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from . import __version__
from .backends import available, get
from .check_command import CHECK_DESCRIPTION, add_check_arguments, run_check
from .errors import BackendUnavailableError, VLAError, VLAInputError
from .progress import ProgressBar
from .properties.strategies import ShapeBounds
from .spec import VLAConfig
from .validation import ValidationReport, validate

__all__ = ["build_parser", "conformance", "main", "parse_config"]


def parse_config(exact: bool, assignments: Sequence[str]) -> VLAConfig:
    """A :class:`VLAConfig` from ``--exact`` and ``--set FIELD=VALUE`` options."""
    fields = {f for f in VLAConfig.__dataclass_fields__}
    values: dict[str, Any] = {}
    for item in assignments:
        name, sep, raw = item.partition("=")
        name = name.strip()
        if not sep or name not in fields:
            raise VLAInputError(
                "--set", f"expected FIELD=VALUE with FIELD in {sorted(fields)}, got {item!r}"
            )
        raw = raw.strip()
        if raw.lower() in ("none", "null"):
            values[name] = None
        elif raw.lower() in ("true", "false"):
            values[name] = raw.lower() == "true"
        else:
            try:
                values[name] = int(raw) if name == "nudge_period" else float(raw)
            except ValueError:
                raise VLAInputError(f"--set {name}", f"expected a number, got {raw!r}") from None
    return VLAConfig.exact(**values) if exact else VLAConfig(**values)


def _load_function(target: str) -> Callable[..., Any]:
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise VLAInputError("MODULE:FUNC", f"expected 'package.module:function', got {target!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(
            0, os.getcwd()
        )  # so that `vla-verify check mykernel:fn` finds ./mykernel.py
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise VLAInputError("MODULE:FUNC", f"cannot import {module_name!r}: {exc}") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise VLAInputError("MODULE:FUNC", f"{module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise VLAInputError("MODULE:FUNC", f"{target!r} is not callable")
    return obj


def _add_config_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--exact",
        action="store_true",
        help="use VLAConfig.exact() (no nudges) as the base configuration",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a VLAConfig field, e.g. --set lambda0=1 (repeatable)",
    )


def cmd_check(args: argparse.Namespace) -> int:
    return run_check(args)


def cmd_backends(args: argparse.Namespace) -> int:
    rows = available()
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "name": r.name,
                        "available": r.available,
                        "reason": r.reason,
                        "summary": r.summary,
                        "capabilities": None
                        if r.capabilities is None
                        else {
                            "array": r.capabilities.array,
                            "devices": list(r.capabilities.devices),
                            "dtypes": list(r.capabilities.dtypes),
                            "variants": list(r.capabilities.variants),
                            "differentiable": r.capabilities.differentiable,
                        },
                    }
                    for r in rows
                ],
                indent=1,
            )
        )
        return 0
    print(
        f"{'backend':<15} {'here':<5} {'array':<6} {'devices':<10} {'dtypes':<34} {'grad':<5} notes"
    )
    for r in rows:
        c = r.capabilities
        if c is None:
            print(f"{r.name:<15} {'no':<5} {'-':<6} {'-':<10} {'-':<34} {'-':<5} {r.reason}")
            continue
        note = r.reason or r.summary
        print(
            f"{r.name:<15} {'yes' if r.available else 'no':<5} {c.array:<6} "
            f"{','.join(c.devices):<10} {','.join(c.dtypes):<34} "
            f"{'yes' if c.differentiable else 'no':<5} {note}"
        )
    return 0


@dataclass
class ConformanceRow:
    """One (backend, dtype) line of the conformance report."""

    backend: str
    dtype: str
    device: str
    verdict: str  # PASSED | FAILED | SKIPPED
    examples: int
    worst_ratio: float | None
    seconds: float
    note: str

    def as_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


#: Per backend: dtypes to check in `run` and the largest shapes (mpmath is slow).
_RUN_PLAN: dict[str, tuple[tuple[str, ...], ShapeBounds | None, float]] = {
    "numpy": (("float64", "float32"), None, 1.0),
    "mpmath": (("float64",), ShapeBounds(max_B=1, max_H=1, max_T=24, max_dk=3, max_dv=3), 0.2),
    "torch": (("float64", "float32", "bfloat16"), None, 1.0),
    "torch_chunked": (("float64", "float32", "bfloat16"), None, 1.0),
    "triton_fused": (("float32", "bfloat16"), None, 0.5),
    "triton_chunked": (("float32", "bfloat16"), None, 0.5),
    "fla": (("float32", "bfloat16"), ShapeBounds(max_T=24), 0.5),
}


def conformance(
    names: Sequence[str] | None = None,
    *,
    max_examples: int = 30,
    seed: int = 0,
    show_progress: bool = True,
) -> list[ConformanceRow]:
    """Validate every available backend (or ``names``) against the oracle, variant ``vla``."""
    rows: list[ConformanceRow] = []
    statuses = {s.name: s for s in available()}
    for name in names or list(statuses):
        status = statuses.get(name)
        if status is None:
            raise VLAInputError("--backends", f"unknown backend {name!r}; known: {list(statuses)}")
        if not status.available or status.capabilities is None:
            rows.append(
                ConformanceRow(
                    name, "-", "-", "SKIPPED", 0, None, 0.0, status.reason or "unavailable"
                )
            )
            continue
        caps = status.capabilities
        dtypes, bounds, scale = _RUN_PLAN.get(name, (caps.dtypes, None, 1.0))
        if "cuda" in caps.devices and _cuda_available():
            device = "cuda"
        else:
            device = "cpu" if "cpu" in caps.devices else caps.devices[0]
        backend = get(name)
        for dtype in dtypes:
            if dtype not in caps.dtypes:
                continue
            config, config_note = _run_config(backend, dtype, device)
            n = max(5, int(max_examples * scale))
            bar = ProgressBar(f"conformance {name} {dtype}", n, enabled=show_progress)
            try:
                report: ValidationReport = validate(
                    backend,
                    config=config,
                    array=caps.array,
                    dtype=dtype,
                    device=device,
                    max_examples=n,
                    seed=seed,
                    bounds=bounds,
                    progress=bar,
                )
            except (VLAError, BackendUnavailableError) as exc:
                bar.close()
                rows.append(ConformanceRow(name, dtype, device, "SKIPPED", 0, None, 0.0, str(exc)))
                continue
            bar.close()
            note = "; ".join(
                x for x in (config_note, "" if report.passed else report.failures[0].message) if x
            )
            rows.append(
                ConformanceRow(
                    name,
                    dtype,
                    device,
                    "PASSED" if report.passed else "FAILED",
                    report.examples,
                    report.worst_ratio,
                    report.elapsed_s,
                    note,
                )
            )
            if not report.passed:
                print(report.summary(), file=sys.stderr)
    return rows


def _run_config(backend: Any, dtype: str, device: str) -> tuple[VLAConfig, str]:
    """The paper preset if the backend takes it, else the nearest configuration it does take
    (a chunked backend needs nudges at chunk boundaries), with a note saying which."""
    from .spec import Shapes

    one = Shapes(1, 1, 1, 1, 1)
    preset = VLAConfig()
    if backend.check_support(preset, one, dtype, device) is None:
        return preset, ""
    chunk = getattr(backend, "options", {}).get("chunk_size")
    for config in ([preset.replace(nudge_period=chunk)] if chunk else []) + [VLAConfig.exact()]:
        if backend.check_support(config, one, dtype, device) is None:
            return config, f"config: nudge_period={config.nudge_period} (the preset's 20 refused)"
    return preset, ""


def use_triton_interpreter_without_gpu() -> bool:
    """Set ``TRITON_INTERPRET=1`` when there is no CUDA GPU and the user has not chosen, so that
    the Triton kernels are checked on the CPU.  Must run before triton is imported; returns
    whether it did."""
    if "TRITON_INTERPRET" in os.environ or "triton" in sys.modules or _cuda_available():
        return False
    os.environ["TRITON_INTERPRET"] = "1"
    return True


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _print_conformance(rows: Sequence[ConformanceRow]) -> None:
    print("Conformance against the float64 oracle (variant vla, error budget of spec §4)")
    print(
        f"{'backend':<15} {'dtype':<9} {'device':<6} {'verdict':<8} {'examples':>8} "
        f"{'err/budget':>10} {'time':>7}  note"
    )
    for r in rows:
        ratio = "-" if r.worst_ratio is None else f"{r.worst_ratio:.3g}"
        print(
            f"{r.backend:<15} {r.dtype:<9} {r.device:<6} {r.verdict:<8} {r.examples:>8} "
            f"{ratio:>10} {r.seconds:>6.1f}s  {r.note}"
        )


def cmd_run(args: argparse.Namespace) -> int:
    names = [n.strip() for n in args.backends.split(",")] if args.backends else None
    if use_triton_interpreter_without_gpu():
        print("no CUDA GPU: Triton kernels run through Triton's interpreter (TRITON_INTERPRET=1)")
    rows = conformance(
        names, max_examples=args.max_examples, seed=args.seed, show_progress=not args.quiet
    )
    _print_conformance(rows)
    report: dict[str, Any] = {"version": __version__, "conformance": [r.as_dict() for r in rows]}
    failed = any(r.verdict == "FAILED" for r in rows)
    claims_hook = _claims_hook()
    if claims_hook is not None and not args.skip_claims:
        print()
        claims_report = claims_hook(args)
        report["claims"] = claims_report
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1, default=str)
        print(f"\nwrote {args.json}")
    return 1 if failed else 0


def _optional(module_name: str, attr: str) -> Any | None:
    """``module.attr`` of a part of vla_verify that may not be present in this version."""
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            return None
        raise
    return getattr(module, attr, None)


def _claims_hook() -> Callable[[argparse.Namespace], Any] | None:
    """The claims ledger's entry point for ``run`` (``vla_verify.proofs.ledger.run_from_cli``)."""
    return _optional("vla_verify.proofs.ledger", "run_from_cli")


def _add_optional_subcommand(sub: Any, module_name: str, name: str, help_text: str) -> None:
    """Subcommands owned by other modules: ``add_arguments(parser)`` and ``main(args) -> int``."""
    add_arguments = _optional(module_name, "add_arguments")
    run = _optional(module_name, "main")
    if add_arguments is None or run is None:
        return
    p = sub.add_parser(name, help=help_text, description=help_text)
    add_arguments(p)
    p.set_defaults(func=run)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vla-verify",
        description="Verification and property testing for Variational Linear Attention.",
    )
    parser.add_argument("--version", action="version", version=f"vla-verify {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "check", help="validate MODULE:FUNC against the oracle", description=CHECK_DESCRIPTION
    )
    add_check_arguments(p)
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("backends", help="list the registry: what runs here and why not")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_backends)

    p = sub.add_parser(
        "run",
        help="the main job: conformance of every backend, then the claims",
        description="Validate every available backend against the oracle and "
        "compute the claims ledger; print one report.",
    )
    p.add_argument("--backends", default=None, help="comma-separated backends (default: all)")
    p.add_argument("--max-examples", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--profile",
        choices=("quick", "thorough"),
        default="quick",
        help="search effort of the claims ledger",
    )
    p.add_argument("--skip-claims", action="store_true", help="conformance only")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the report as JSON")
    p.add_argument(
        "--outdir",
        default="vla-verify-report",
        metavar="DIR",
        help="where the claims ledger writes its reports and plots",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_run)

    _add_optional_subcommand(
        sub,
        "vla_verify.proofs.ledger",
        "claims",
        "compute the verdict of every claim of spec §3 with its evidence",
    )
    _add_optional_subcommand(
        sub, "vla_verify.bench", "bench", "time the kernels on the standard grid and print a table"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except VLAInputError as exc:
        print(f"vla-verify: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
