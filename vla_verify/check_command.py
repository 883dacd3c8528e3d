"""The ``vla-verify check`` subcommand: its options and what it runs (spec §4).

``vla-verify check MODULE:FUNC`` validates an implementation with :func:`vla_verify.validate`
(exit 0 passed, 1 failed, 2 usage error); ``--replay FILE`` reruns exactly the case a failure
saved.  :func:`add_check_arguments` defines the options on the parser ``vla_verify.cli`` creates;
:func:`run_check` is the command.
"""

from __future__ import annotations

import argparse

from .arrays import ARRAY_LIBRARIES
from .error_model import DEFAULT_FACTOR
from .spec import FLOAT_DTYPES, VARIANTS
from .validation import DEFAULT_FAILURE_DIR, FAILURE_DIR_ENV, PROFILES, replay, validate

__all__ = ["CHECK_DESCRIPTION", "add_check_arguments", "run_check"]

CHECK_DESCRIPTION = (
    "Validate an implementation fn(q, k, v, u, *, config, initial_state=None[, start=0]) -> "
    "o | (o, (S, A, z)) against the float64 oracle on Hypothesis-generated inputs that reach "
    "tiling widths (dk, dv up to 128), several chunks of 64 and 128 tokens and B·H up to 6. "
    "Exit 0 if it passed, 1 if it failed (the shrunk counterexample is printed and saved, with "
    "a replay line), 2 on a usage error."
)


def add_check_arguments(p: argparse.ArgumentParser) -> None:
    """Every option of ``check``, each with its default in its help."""
    from .cli import _add_config_options

    p.add_argument(
        "target",
        metavar="MODULE:FUNC",
        help="the implementation: package.module:function, or a registry backend name",
    )
    p.add_argument(
        "--variant", choices=VARIANTS, default="vla", help="the recurrence (default: %(default)s)"
    )
    p.add_argument(
        "--array",
        choices=ARRAY_LIBRARIES,
        default=None,
        help="array library fn is fed (default: a backend's own, else numpy)",
    )
    p.add_argument("--dtype", choices=FLOAT_DTYPES, default="float64", help="default: %(default)s")
    p.add_argument("--device", default="cpu", help="array device (default: %(default)s)")
    p.add_argument(
        "--profile",
        choices=tuple(PROFILES),
        default="default",
        help="search effort: "
        + ", ".join(f"{k} = {v} examples" for k, v in PROFILES.items())
        + " (default: %(default)s)",
    )
    p.add_argument(
        "--max-examples",
        type=int,
        default=None,
        help="examples to try (default: the profile's)",
    )
    p.add_argument(
        "--seed", type=int, default=None, help="Hypothesis seed (default: drawn and printed)"
    )
    p.add_argument(
        "--max-dk",
        type=int,
        default=None,
        help="largest head width dk and dv drawn (default: 128; not with --head-dims)",
    )
    p.add_argument(
        "--head-dims",
        type=int,
        nargs="+",
        default=None,
        metavar="W",
        help="draw dk and dv from these widths only, e.g. 64 128, the widths the kernel "
        "supports (default: tiling and ragged widths up to --max-dk)",
    )
    p.add_argument(
        "--max-T", type=int, default=640, help="longest sequence drawn (default: %(default)s)"
    )
    p.add_argument(
        "--max-batch",
        type=int,
        default=6,
        help="largest B·H drawn (default: %(default)s)",
    )
    p.add_argument(
        "--chunk-size",
        type=int,
        default=None,
        metavar="C",
        help="declare a chunked implementation's chunk length: lengths and carry cuts aim at "
        "multiples of C and C ± 1, and the float32/float64 floor of the error budget grows "
        "with its dk + C terms (default: none; a backend declares its own)",
    )
    p.add_argument(
        "--sweep-config",
        action="store_true",
        help="also draw configurations (λ0 over decades, nudge periods 1, 3, 7, 48, 96 and none, "
        "both normalisations, tiny and large floors) so that an ignored field is caught "
        "(default: the given configuration only)",
    )
    p.add_argument(
        "--factor",
        type=float,
        default=DEFAULT_FACTOR,
        help="spec §4 factor over the same-precision oracle's error (default: %(default)s)",
    )
    p.add_argument(
        "--no-carry",
        action="store_true",
        help="skip the state-carry check (default: checked when fn returns a state)",
    )
    p.add_argument(
        "--failure-dir",
        default=None,
        metavar="DIR",
        help=f"where a failing case is saved (default: ${FAILURE_DIR_ENV} or "
        f"{DEFAULT_FAILURE_DIR})",
    )
    p.add_argument(
        "--replay",
        default=None,
        metavar="FILE",
        help="rerun exactly the case a failure saved, with its settings (default: search)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar (default: shown)")
    _add_config_options(p)


def run_check(args: argparse.Namespace) -> int:
    """Run ``check``: 0 passed, 1 failed (usage errors raise and become exit 2 in the CLI)."""
    from .cli import _load_function, parse_config
    from .progress import ProgressBar

    # package.module:function is imported as the CLI imports it (the working directory first);
    # a bare name is a registry backend, which validate resolves.
    fn = _load_function(args.target) if ":" in args.target else args.target
    if args.replay is not None:
        report = replay(args.replay, fn)
        print(report.summary())
        return 0 if report.passed else 1
    config = parse_config(args.exact, args.set)
    total = args.max_examples if args.max_examples is not None else PROFILES[args.profile]
    bar = ProgressBar(f"check {args.target}", total, enabled=not args.quiet)
    try:
        report = validate(
            fn,
            config=config,
            variant=args.variant,
            array=args.array,
            dtype=args.dtype,
            device=args.device,
            max_examples=args.max_examples,
            profile=args.profile,
            seed=args.seed,
            factor=args.factor,
            check_carry=not args.no_carry,
            chunk_size=args.chunk_size,
            progress=bar,
            max_dk=args.max_dk,
            head_dims=args.head_dims,
            max_T=args.max_T,
            max_batch=args.max_batch,
            configs="sweep" if args.sweep_config else "given",
            failure_dir=args.failure_dir,
        )
    finally:
        bar.close()
    report.name = args.target
    print(report.summary())
    return 0 if report.passed else 1
