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
from typing import Any

from . import __version__
from .backends import Backend, available
from .check_command import CHECK_DESCRIPTION, add_check_arguments, run_check
from .conformance import ConformanceRow, conformance, format_conformance
from .errors import BackendUnavailableError, VLAInputError
from .runtime import (
    cuda_available,
    fold_interpreter_reductions,
    round_interpreter_bf16_to_nearest,
    seed_only_draws,
    use_triton_interpreter_without_gpu,
)
from .spec import VLAConfig

__all__ = ["ConformanceRow", "build_parser", "conformance", "main", "parse_config"]

#: Subcommands whose figures must depend on the seed alone (runtime.seed_only_draws).
_SEEDED = ("run", "claims")


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
    if isinstance(obj, Backend):
        reason = obj.availability()
        if reason is not None:
            raise VLAInputError("MODULE:FUNC", f"{target!r} cannot run here: {reason}")
    if str(getattr(obj, "__module__", "") or "").split(".")[0] == "fla":
        gpu = "" if cuda_available() else " (and there is no CUDA GPU here)"
        raise VLAInputError(
            "MODULE:FUNC",
            f"{target!r} is an fla kernel, not a spec §4 callable fn(q, k, v, u, *, config, "
            f"initial_state=None){gpu}: check it through the adapter, `vla-verify run "
            "--backends fla`, or wrap it in a function of that signature",
        )
    return obj


def _check_positive(value: Any, argument: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise VLAInputError(argument, f"expected a positive integer, got {value!r}")
    return value


def _check_writable(path: str | None, argument: str) -> None:
    """Refuse, before any work, an output path whose folder is missing or that is a folder."""
    if path is None:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path) or not os.path.isdir(folder):
        raise VLAInputError(argument, f"expected a file path in an existing folder, got {path!r}")


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


def cmd_run(args: argparse.Namespace) -> int:
    names = [n.strip() for n in args.backends.split(",")] if args.backends else None
    if names is not None and not all(names):
        raise VLAInputError("--backends", f"expected comma-separated names, got {args.backends!r}")
    _check_positive(args.max_examples, "--max-examples")
    _check_writable(args.json, "--json")
    if os.path.exists(args.outdir) and not os.path.isdir(args.outdir):
        raise VLAInputError("--outdir", f"expected a folder, got the file {args.outdir!r}")
    rows = conformance(
        names, max_examples=args.max_examples, seed=args.seed, show_progress=not args.quiet
    )
    print(format_conformance(rows))
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
        sub,
        "vla_verify.bench",
        "bench",
        "run a benchmark suite (correctness gates first): JSON, table and plot",
    )
    # Listed here for --help; main() hands its arguments to vla_verify.experiments.cli.
    sub.add_parser(
        "experiments",
        help="train and score the paper's experiments (MQAR, copy, state norm): "
        "run | list | report (vla-verify experiments --help)",
        add_help=False,
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # Before anything imports triton (building the parser imports the ledger and the bench):
    # every subcommand sees the same backends.
    interpreting = use_triton_interpreter_without_gpu()
    fold_interpreter_reductions()
    round_interpreter_bf16_to_nearest()
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["experiments"]:
        from .experiments.cli import main as run_experiments

        return int(run_experiments(argv[1:]))
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if interpreting:
            print(
                "vla-verify: no CUDA GPU: Triton kernels run through Triton's interpreter "
                "(TRITON_INTERPRET=1)",
                file=sys.stderr,
            )
        if args.command in _SEEDED:
            with seed_only_draws():
                return int(args.func(args))
        return int(args.func(args))
    except (VLAInputError, BackendUnavailableError) as exc:
        print(f"vla-verify: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (`vla-verify backends --json | head`): stop quietly.  Point
        # stdout at /dev/null so that the interpreter's last flush does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
