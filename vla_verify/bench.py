"""``vla-verify bench --suite NAME``: the kernel benchmarks, correctness gates first.

A suite names the kernels it checks, the ops it times and the grid (spec §2.3 kernels; the
layout of every tensor is ``[B, T, H, D]``, spec §1):

- ``grid`` — the recurrent Triton kernel against its anchors (``fused.json``): ops
  ``vla_triton_fused`` (:func:`~vla_verify.backends.triton_fused.fused_recurrent_vla`, all T steps
  in one launch), ``vla_torch_sequential`` (the PyTorch per-token loop, only up to
  ``--sequential-max-T``), flash-linear-attention's ``fla_fused_recurrent_dplr`` (forward) and
  ``fla_fused_recurrent_delta`` when ``import fla`` works, and causal softmax attention ``sdpa``;
  D ∈ {64, 128}, T ∈ {1k, 4k, 16k, 64k}, bf16, modes ``fwd`` and ``fwdbwd``;
- ``torch`` — the PyTorch backends (``torch.json``): ``torch_chunked`` (spec §5) against
  ``torch`` (sequential) and ``sdpa``; D = 64, T ∈ {1k … 16k};
- ``overhead`` — the registry call ``backends.get("triton_fused")(…)`` against the direct call
  of :func:`~vla_verify.backends.triton_fused.fused_recurrent_vla` (``overhead.json``), forward,
  at lengths where a fixed cost shows;
- ``chunk`` — the chunked Triton kernel (``chunk.json``, only when the backend
  ``triton_chunked`` is available): ops ``vla_triton_chunked``, ``vla_triton_fused``, fla's
  ``fla_chunk_delta`` and ``fla_chunk_dplr``, and ``sdpa``; like ``torch``, without nudges
  (``VLAConfig.exact()``: the chunked form nudges only at chunk boundaries, spec §5).

Every run first computes the correctness gates of the suite's kernels — ``validate`` (spec §4
budgets) in float32 and bfloat16, gradients of q, k, v, u and the initial state against the
PyTorch sequential backend in float64 at a small size, and a finite forward and backward at the
longest T of the grid — and times nothing when one is red.  Times are medians of
:func:`triton.testing.do_bench` (CUDA events, warm-up first), never the host clock; every op of
a shape is warmed up (compiled, autotuned) before any is timed.  The kernels are called through
their semantic API only (configuration, initial state): the backend's own plan picks the rest.

Output: ``OUT/<suite>.json`` = ``{"suite", "machine", "records", "correctness", "tuning"}``
(records ``{op, B, T, H, D, dtype, mode, median_ms}``; machine: GPU, driver, CUDA, torch,
triton, fla, commit), a table on stdout and ``OUT/<suite>.png``, median latency against T on
log-log axes with the fitted exponent of each line.

Without a GPU the command says so and exits 2; ``--cpu`` runs the suite's torch-backed parts
on the CPU with the host clock (a test of this code path, not a benchmark).

Importing this module imports neither torch nor triton (the CLI imports it to build its parser).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .progress import ProgressBar

__all__ = [
    "OPS",
    "SUITES",
    "DeviceClock",
    "Record",
    "Suite",
    "SuiteRun",
    "add_arguments",
    "card_folder",
    "fitted_exponents",
    "format_table",
    "load_run",
    "machine_info",
    "main",
    "make_ops",
    "plot_latency",
    "replot",
    "run_suite",
    "time_ms",
    "write_outputs",
]

Kernel = Callable[..., Any]  # fn(q, k, v, u, *, config, initial_state=None) -> (o, (S, A, z))
Timer = Callable[[Callable[[], Any]], float]

OPS = (
    "vla_triton_fused",
    "vla_triton_chunked",
    "vla_torch_sequential",
    "torch",
    "torch_chunked",
    "registry_triton_fused",
    "direct_triton_fused",
    "fla_fused_recurrent_dplr",
    "fla_fused_recurrent_delta",
    "fla_chunk_delta",
    "fla_chunk_dplr",
    "sdpa",
)
# Ops that run one of this project's backends, by registry name.
BACKEND_OPS = {
    "vla_triton_fused": "triton_fused",
    "vla_triton_chunked": "triton_chunked",
    "vla_torch_sequential": "torch",
    "torch": "torch",
    "torch_chunked": "torch_chunked",
    "registry_triton_fused": "triton_fused",
    "direct_triton_fused": "triton_fused",
}
SEQUENTIAL_OPS = ("vla_torch_sequential", "torch")  # one token per step: slow at long T
STANDARD_T = (1024, 4096, 16384, 65536)
STANDARD_D = (64, 128)


@dataclass(frozen=True)
class Suite:
    """What one suite checks and times."""

    name: str
    output: str  # the JSON file it writes
    summary: str
    kernels: tuple[str, ...]  # backends whose correctness gates run first
    ops: tuple[str, ...]
    Ts: tuple[int, ...]
    Ds: tuple[int, ...]
    modes: tuple[str, ...] = ("fwd", "fwdbwd")
    sequential_max_T: int = 1024
    exact: bool = False  # time the configuration without nudges (``VLAConfig.exact()``)
    requires: str | None = None  # a backend that must be available for the suite to run


SUITES: dict[str, Suite] = {
    s.name: s
    for s in (
        Suite(
            "grid",
            "fused.json",
            "the recurrent Triton kernel against torch sequential, fla and SDPA",
            kernels=("triton_fused",),
            ops=(
                "vla_triton_fused",
                "vla_torch_sequential",
                "fla_fused_recurrent_dplr",
                "fla_fused_recurrent_delta",
                "sdpa",
            ),
            Ts=STANDARD_T,
            Ds=STANDARD_D,
        ),
        Suite(
            "torch",
            "torch.json",
            "the PyTorch chunked backend against the sequential one and SDPA",
            kernels=("torch_chunked",),
            ops=("torch_chunked", "torch", "sdpa"),
            Ts=(1024, 2048, 4096, 8192, 16384),
            Ds=(64,),
            sequential_max_T=4096,
            exact=True,
        ),
        Suite(
            "overhead",
            "overhead.json",
            "the registry call against the direct kernel call (the fixed cost of a call)",
            kernels=("triton_fused",),
            ops=("registry_triton_fused", "direct_triton_fused"),
            Ts=(16, 256, 1024, 4096),
            Ds=STANDARD_D,
            modes=("fwd",),
        ),
        Suite(
            "chunk",
            "chunk.json",
            "the chunked Triton kernel against the recurrent one, fla's chunked kernels and SDPA",
            kernels=("triton_chunked", "triton_fused"),
            ops=(
                "vla_triton_chunked",
                "vla_triton_fused",
                "fla_chunk_delta",
                "fla_chunk_dplr",
                "sdpa",
            ),
            Ts=STANDARD_T,
            Ds=STANDARD_D,
            exact=True,  # the chunked form nudges only at chunk boundaries (spec §5)
            requires="triton_chunked",
        ),
    )
}


@dataclass
class Record:
    """One timed point of the grid."""

    op: str
    B: int
    T: int
    H: int
    D: int
    dtype: str
    mode: str  # "fwd" | "fwdbwd"
    median_ms: float


@dataclass
class SuiteRun:
    """What :func:`run_suite` measured: ``passed`` is False when a gate is red (no records)."""

    suite: str
    machine: dict[str, Any]
    correctness: dict[str, dict[str, Any]]
    records: list[Record] = field(default_factory=list)
    tuning: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return bool(self.correctness) and all(g.get("passed") for g in self.correctness.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "suite": self.suite,
            "machine": self.machine,
            "records": [asdict(r) for r in self.records],
            "correctness": self.correctness,
            "tuning": self.tuning,
        }


# -- the machine ---------------------------------------------------------------------------------


def git_commit() -> str | None:
    """The commit of the source tree this module runs from (``None`` outside a git checkout)."""
    root = Path(__file__).resolve().parents[1]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def card_folder(device_name: str) -> str:
    """The results folder of a device name (``benchmarks/results/<folder>/``): lower case,
    without the vendor and without the memory's size and kind, which name the same card
    (``NVIDIA H100 80GB HBM3`` -> ``h100``, ``NVIDIA H200`` -> ``h200``), but with the form
    factor, which changes its speed (``NVIDIA H100 PCIe`` -> ``h100-pcie``)."""
    import re

    words = re.findall(r"[a-z0-9]+", device_name.lower())
    kept = [w for w in words if w != "nvidia" and not re.fullmatch(r"\d+gb|hbm\d*e?", w)]
    return "-".join(kept) or "gpu"


def machine_info() -> dict[str, Any]:
    """GPU name, driver, CUDA, torch, triton (and fla when present), for every stored result."""
    import torch

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": None,
        "cuda": torch.version.cuda,
        "gpu": None,
        "driver": None,
        "sm_count": None,
        "triton_interpret": os.environ.get("TRITON_INTERPRET", ""),
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        pass
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info["gpu"] = props.name
        info["sm_count"] = props.multi_processor_count
        info["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            info["driver"] = out.stdout.strip().splitlines()[0] if out.returncode == 0 else None
        except (OSError, subprocess.SubprocessError, IndexError):
            info["driver"] = None
    try:
        import fla

        info["fla"] = getattr(fla, "__version__", "unknown")
    except Exception as exc:  # fla is optional; record why it is missing
        info["fla"] = f"unavailable ({type(exc).__name__})"
    return info


class DeviceClock:
    """A pytest-benchmark timer that reads device time: it advances only when told to (by the
    last ``do_bench`` median, in seconds), so that pytest-benchmark's statistics — and its
    ``--benchmark-compare-fail`` gate — are about GPU time, not host time."""

    def __init__(self) -> None:
        self.now = 0.0

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def __call__(self) -> float:
        return self.now


def time_ms(fn: Callable[[], Any], *, device: str = "cuda") -> float:
    """Median milliseconds of ``fn``: ``do_bench`` (CUDA events, 25 ms warm-up, 100 ms of
    repetitions) on a GPU; on the CPU, the median of 3 host-clock runs (a code-path test)."""
    if device != "cuda":
        times = []
        for _ in range(3):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return sorted(times)[1]
    import triton

    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


# -- inputs and ops ------------------------------------------------------------------------------


def _inputs(B: int, T: int, H: int, D: int, dtype: Any, device: str, seed: int = 0) -> dict:
    """Valid-domain inputs (spec §2.1): φ-features q, k > 0; unit-scaled penalties u; unit q, k
    for fla's kernels (their keys must be normalised); ``do`` the output cotangent."""
    import torch
    import torch.nn.functional as F

    g = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape: int) -> Any:
        return torch.randn(*shape, device=device, generator=g, dtype=torch.float32)

    q = F.elu(randn(B, T, H, D)) + 1
    k = F.elu(randn(B, T, H, D)) + 1
    v = randn(B, T, H, D)
    u = F.normalize(randn(B, T, H, D), dim=-1) / D**0.5
    return {
        "q": q.to(dtype),
        "k": k.to(dtype),
        "v": v.to(dtype),
        "u": u.to(dtype),
        "q_unit": F.normalize(q, dim=-1).to(dtype),
        "k_unit": F.normalize(k, dim=-1).to(dtype),
        "do": randn(B, T, H, D).to(dtype),
    }


def _grad_op(forward: Callable[..., Any], leaves: list[Any], do: Any) -> Callable[[], Any]:
    import torch

    def fwdbwd() -> Any:
        return torch.autograd.grad(forward(*leaves), leaves, do)

    return fwdbwd


def _fla_ops(x: dict, ops: set[str]) -> dict[tuple[str, str], Callable[[], Any]]:
    """fla's kernels on unit keys with ``beta = 1`` and ``a = −k̂, b = k̂`` (the delta rule as
    DPLR); empty when fla cannot be imported or there is no GPU."""
    import torch

    wanted = {o for o in ops if o.startswith("fla_")}
    if not wanted or x["q"].device.type != "cuda":  # fla's kernels need a GPU
        return {}
    try:
        from fla.ops.delta_rule import chunk_delta_rule, fused_recurrent_delta_rule
        from fla.ops.generalized_delta_rule import fused_recurrent_dplr_delta_rule
        from fla.ops.generalized_delta_rule.dplr import chunk_dplr_delta_rule
    except Exception:  # fla-core not installed: those rows are simply absent
        return {}
    qu, ku, v, do = x["q_unit"], x["k_unit"], x["v"], x["do"]
    beta = torch.ones(*qu.shape[:3], device=qu.device, dtype=qu.dtype)
    gk = torch.zeros(qu.shape, device=qu.device, dtype=torch.float32)
    leaves = [t.detach().clone().requires_grad_() for t in (qu, ku, v)]

    def dplr(fn: Callable[..., Any]) -> Callable[..., Any]:
        return lambda q, k, v: fn(q, k, v, -k, k, gk, scale=1.0)[0]

    def delta(fn: Callable[..., Any]) -> Callable[..., Any]:
        return lambda q, k, v: fn(q, k, v, beta, scale=1.0)[0]

    forwards = {
        "fla_fused_recurrent_dplr": dplr(fused_recurrent_dplr_delta_rule),
        "fla_fused_recurrent_delta": delta(fused_recurrent_delta_rule),
        "fla_chunk_delta": delta(chunk_delta_rule),
        "fla_chunk_dplr": dplr(chunk_dplr_delta_rule),
    }
    out: dict[tuple[str, str], Callable[[], Any]] = {}
    for name in wanted & set(forwards):
        fwd = forwards[name]
        out[name, "fwd"] = functools.partial(fwd, qu, ku, v)
        if name != "fla_fused_recurrent_dplr":  # fla implements no backward for it
            out[name, "fwdbwd"] = _grad_op(fwd, leaves, do)
    return out


def make_ops(
    x: dict,
    *,
    ops: Iterable[str] | None = None,
    config: Any = None,
    kernels: Mapping[str, Kernel] | None = None,
) -> dict[tuple[str, str], Callable[[], Any]]:
    """``{(op, mode): fn}`` for one input set from :func:`_inputs` (modes ``fwd``, ``fwdbwd``).

    ``ops`` (default: those of the ``grid`` suite) are the names of :data:`OPS`; ops that cannot
    run here (fla missing) are absent.  ``config`` is the :class:`~vla_verify.VLAConfig` the
    kernels run (default the paper preset).  ``kernels`` replaces a backend by name (a kernel
    under test, e.g. a planted wrong one).  Kernels are called through their semantic API only.
    """
    import torch
    import torch.nn.functional as F

    from .backends import get

    wanted = set(SUITES["grid"].ops if ops is None else ops)
    unknown = wanted - set(OPS)
    if unknown:
        from .errors import VLAInputError

        raise VLAInputError("ops", f"expected names of {list(OPS)}, got {sorted(unknown)}")
    q, k, v, u, do = x["q"], x["k"], x["v"], x["u"], x["do"]
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, u)]
    table: dict[tuple[str, str], Callable[[], Any]] = {}
    for op in sorted(wanted & set(BACKEND_OPS)):
        name = BACKEND_OPS[op]
        if kernels and name in kernels:
            fn: Kernel = kernels[name]
        elif op in ("vla_triton_fused", "direct_triton_fused"):
            # The kernel's own function: what the stored baselines time.
            from .backends.triton_fused import fused_recurrent_vla as fn
        else:
            fn = get(name)

        def forward(q: Any, k: Any, v: Any, u: Any, fn: Kernel = fn) -> Any:
            return fn(q, k, v, u, config=config)[0]

        table[op, "fwd"] = functools.partial(forward, q, k, v, u)
        table[op, "fwdbwd"] = _grad_op(forward, leaves, do)
    if "sdpa" in wanted:
        # SDPA is head-first: [B, H, T, D].
        qh, kh, vh = (t.transpose(1, 2).contiguous() for t in (q, k, v))
        sd_leaves = [t.detach().clone().requires_grad_() for t in (qh, kh, vh)]

        def sdpa(q: Any, k: Any, v: Any) -> Any:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        table["sdpa", "fwd"] = lambda: sdpa(qh, kh, vh)
        table["sdpa", "fwdbwd"] = _grad_op(sdpa, sd_leaves, do.transpose(1, 2).contiguous())
    table.update(_fla_ops(x, wanted))
    if q.device.type == "cuda":
        torch.cuda.synchronize()
    return table


# -- correctness gates ---------------------------------------------------------------------------


@dataclass(frozen=True)
class GateSizes:
    """How hard the gates look: Hypothesis examples of ``validate``, the largest head width it
    draws, the gradient shapes ``(B, T, H, dk, dv)``."""

    examples: int = 30
    wide_dk: int = 128
    wide_examples: int = 8
    grad_shapes: tuple[tuple[int, int, int, int, int], ...] = (
        (1, 96, 2, 16, 24),
        (2, 200, 2, 64, 64),
        (1, 40, 2, 96, 80),
    )

    @classmethod
    def small(cls) -> GateSizes:
        """The CPU run: a few examples at tiny sizes."""
        return cls(examples=2, wide_dk=0, wide_examples=0, grad_shapes=((1, 12, 2, 5, 6),))


def _gate_configs(exact: bool) -> dict[str, tuple[Any, Any]]:
    """The configurations the gates check: the paper preset and an ungated one with a short
    nudge period (spec §2.2); without nudges (``exact``) for kernels timed without them, such as
    the chunked form (nudges only at chunk boundaries, spec §5)."""
    from . import VLAConfig

    if exact:
        pair = (VLAConfig.exact(), VLAConfig.exact(normalize_gate=False))
        return {"validate": pair, "gradients": pair, "timed": (VLAConfig.exact(),) * 2}
    return {
        "validate": (VLAConfig(), VLAConfig(nudge_period=3, normalize_gate=False)),
        "gradients": (VLAConfig(nudge_period=7), VLAConfig.exact(normalize_gate=False)),
        "timed": (VLAConfig(),) * 2,
    }


def _validate_gates(
    name: str, kernel: Kernel, device: str, sizes: GateSizes, exact: bool = False
) -> dict:
    """``validate`` of ``kernel`` (spec §4) in float32 and bfloat16: the timed configuration
    and an ungated one (:func:`_gate_configs`), and (on a GPU) heads up to 128 wide."""
    from . import validate
    from .properties.strategies import ShapeBounds

    wide = ShapeBounds(max_B=1, max_H=2, max_T=64, max_dk=sizes.wide_dk, max_dv=sizes.wide_dk)
    tiny = ShapeBounds(max_T=8, max_dk=4, max_dv=4) if sizes.wide_dk == 0 else ShapeBounds()
    first, second = _gate_configs(exact)["validate"]
    plans: list[tuple[Any, ShapeBounds, int]] = [
        (first, tiny, sizes.examples),
        (second, tiny, max(sizes.examples // 2, 1)),
    ]
    if sizes.wide_examples:
        plans.append((first, wide, sizes.wide_examples))
    out = {}
    for dtype in ("float32", "bfloat16"):
        for i, (config, bounds, n) in enumerate(plans):
            start = time.perf_counter()
            report = validate(
                kernel,
                config=config,
                array="torch",
                dtype=dtype,
                device=device,
                max_examples=n,
                seed=i,
                bounds=bounds,
            )
            out[f"validate_{name}_{dtype}_{i}"] = {
                "passed": report.passed,
                "examples": report.examples,
                "worst_ratio": report.worst_ratio,
                "seconds": round(time.perf_counter() - start, 1),
                "config": repr(config),
                "max_dk": bounds.max_dk,
                "summary": report.summary().splitlines()[0],
            }
            if not report.passed:  # one red plan is enough; the rest would only cost time
                return out
    return out


def _gradient_gates(
    name: str, kernel: Kernel, device: str, sizes: GateSizes, exact: bool = False
) -> dict:
    """Gradients of q, k, v, u, S0, A0, z0 against the PyTorch sequential backend in float64.

    Budget (spec §4 criterion, :func:`vla_verify.gradient_check.check_gradients`): the float64
    error against the larger float32 error of the torch backend (on the inputs and seven copies
    moved by one ulp) and of the kernel, rescaled to float64 by the error model; a wrong
    gradient is O(1) off in both precisions and fails by a factor ~2^29."""
    import numpy as np

    from . import backends
    from .gradient_check import check_gradients

    ref = backends.get("torch")
    out = {}
    for si, (B, T, H, dk, dv) in enumerate(sizes.grad_shapes):
        for config in _gate_configs(exact)["gradients"]:
            rng = np.random.default_rng(si)
            q = np.abs(rng.standard_normal((B, T, H, dk))) + 0.1
            k = rng.standard_normal((B, T, H, dk))
            v = rng.standard_normal((B, T, H, dv))
            u = rng.standard_normal((B, T, H, dk)) / dk
            G = rng.standard_normal((B, H, dk, dk))
            A0 = np.linalg.inv(0.1 * np.eye(dk) + G @ np.swapaxes(G, -1, -2))
            A0 = 0.5 * (A0 + np.swapaxes(A0, -1, -2))
            S0 = rng.standard_normal((B, H, dv, dk))
            z0 = np.abs(rng.standard_normal((B, H, dk))) * 5
            arrays = [q, k, v, u, S0, A0, z0]
            cot = [rng.standard_normal(x.shape) for x in (v, S0, A0, z0)]
            checks = check_gradients(
                kernel, ref, arrays, cot, config=config, dtype="float64", device=device
            )
            ratios = {n: c.ratio for n, c in checks.items()}
            tag = "nudge7" if config.nudge_period else "ungated"
            out[f"grad_{name}_{B}x{T}x{H}x{dk}x{dv}_{tag}"] = {
                "passed": all(x <= 1 for x in ratios.values()),
                "float64_error_over_budget": ratios,
            }
    return out


def _finite_gates(
    name: str,
    kernel: Kernel,
    device: str,
    B: int,
    T: int,
    H: int,
    Ds: Iterable[int],
    dtype: str,
    exact: bool = False,
) -> dict:
    """Forward and backward finite at the longest T of the grid, per head width."""
    import torch

    out = {}
    for D in Ds:
        x = _inputs(B, T, H, D, getattr(torch, dtype), device)
        leaves = [x[n].clone().requires_grad_() for n in ("q", "k", "v", "u")]
        o, state = kernel(*leaves, config=_gate_configs(exact)["timed"][0])
        grads = torch.autograd.grad(o.float().square().mean(), leaves)
        finite = all(bool(torch.isfinite(t).all()) for t in (o, *state, *grads))
        out[f"finite_{name}_T{T}_D{D}"] = {
            "passed": finite,
            "max_abs_o": float(o.detach().float().abs().max()),
        }
        del x, leaves, o, state, grads
    return out


def run_gates(
    kernels: Mapping[str, Kernel],
    *,
    device: str,
    sizes: GateSizes,
    B: int,
    T: int,
    H: int,
    Ds: Iterable[int],
    dtype: str,
    exact: bool = False,
    show_progress: bool = True,
    log: Callable[[str], None] = print,
) -> dict[str, dict[str, Any]]:
    """The gates of every kernel, in order, up to the first red one (a gate that raises is red,
    with its traceback); the steps after it are recorded as skipped (``passed: None``)."""
    steps: list[tuple[str, Callable[[], dict]]] = []
    for name, kernel in kernels.items():
        steps.append(
            (
                f"validate {name}",
                functools.partial(_validate_gates, name, kernel, device, sizes, exact),
            )
        )
        if name != "torch":  # the reference of the gradient gate
            steps.append(
                (
                    f"gradients {name}",
                    functools.partial(_gradient_gates, name, kernel, device, sizes, exact),
                )
            )
        finite = functools.partial(
            _finite_gates, name, kernel, device, B, T, H, tuple(Ds), dtype, exact
        )
        steps.append((f"finite {name} T={T}", finite))
    bar = ProgressBar("correctness gates", len(steps), enabled=show_progress)
    out: dict[str, dict[str, Any]] = {}
    for i, (label, step) in enumerate(steps):
        bar(i)
        if any(g["passed"] is False for g in out.values()):
            out[label.replace(" ", "_")] = {"passed": None, "skipped": "an earlier gate is red"}
            continue
        try:
            results = step()
        except Exception as exc:
            results = {label.replace(" ", "_"): {"passed": False, "error": traceback.format_exc()}}
            log(f"[gate] {label}: raised {type(exc).__name__}: {exc}")
        for key, value in results.items():
            log(f"[gate] {key}: {'green' if value['passed'] else 'RED'}")
        out.update(results)
    bar(len(steps))
    bar.close()
    return out


# -- timing --------------------------------------------------------------------------------------


def time_grid(
    *,
    ops: Iterable[str],
    Ts: Iterable[int],
    Ds: Iterable[int],
    B: int,
    H: int,
    dtype: str,
    modes: Iterable[str],
    device: str,
    sequential_max_T: int,
    config: Any = None,
    kernels: Mapping[str, Kernel] | None = None,
    timer: Timer | None = None,
    show_progress: bool = True,
    log: Callable[[str], None] = print,
) -> list[Record]:
    """Time every (op, D, T, mode); failures are logged and skipped, never timed as zero."""
    import torch

    tdtype = getattr(torch, dtype)
    ops, Ts, Ds, modes = tuple(ops), tuple(Ts), tuple(Ds), tuple(modes)
    clock = timer or (lambda fn: time_ms(fn, device=device))
    records: list[Record] = []
    bar = ProgressBar("timing", len(Ds) * len(Ts), enabled=show_progress)
    for i, (D, T) in enumerate((D, T) for D in Ds for T in Ts):
        bar(i)
        x = _inputs(B, T, H, D, tdtype, device)
        short = [o for o in ops if o not in SEQUENTIAL_OPS or T <= sequential_max_T]
        table = make_ops(x, ops=short, config=config, kernels=kernels)
        chosen = {key: fn for key, fn in table.items() if key[1] in modes}
        # Warm up every op of this shape (compilation, autotuning) before timing any.
        for key, fn in list(chosen.items()):
            try:
                fn()
            except Exception as exc:
                log(f"  {key[0]} {key[1]} D={D} T={T}: FAILED {type(exc).__name__}: {exc}")
                del chosen[key]
        if device == "cuda":
            torch.cuda.synchronize()
        for (op, mode), fn in sorted(chosen.items(), key=lambda kv: ops.index(kv[0][0])):
            ms = clock(fn)
            records.append(Record(op, B, T, H, D, dtype, mode, ms))
            log(f"  {op:26s} {mode:7s} D={D:4d} T={T:6d} {ms:10.3f} ms")
        del x, table, chosen
        if device == "cuda":
            torch.cuda.empty_cache()
    bar(len(Ds) * len(Ts))
    bar.close()
    return records


def run_suite(
    suite: str | Suite,
    *,
    Ts: Sequence[int] | None = None,
    Ds: Sequence[int] | None = None,
    B: int = 1,
    H: int = 16,
    dtype: str = "bfloat16",
    modes: Sequence[str] | None = None,
    ops: Sequence[str] | None = None,
    sequential_max_T: int | None = None,
    device: str = "cuda",
    gate_sizes: GateSizes | None = None,
    kernels: Mapping[str, Kernel] | None = None,
    commit: str | None = None,
    timer: Timer | None = None,
    show_progress: bool = True,
    log: Callable[[str], None] = print,
) -> SuiteRun:
    """Run one suite: the correctness gates of its kernels, then — only when every gate is
    green — the timing grid.  ``kernels`` replaces a suite kernel by backend name (checked and
    timed in its place); ``timer`` replaces :func:`time_ms`."""
    from . import VLAConfig, backends

    s = SUITES[suite] if isinstance(suite, str) else suite
    Ts = tuple(Ts or s.Ts)
    Ds = tuple(Ds or s.Ds)
    info = {**machine_info(), "commit": commit or git_commit()}
    info["timer"] = (
        "triton.testing.do_bench median (CUDA events)"
        if device == "cuda"
        else "host clock, median of 3 (a code-path test, not a benchmark)"
    )
    under_test: dict[str, Kernel] = {
        name: (kernels or {}).get(name) or backends.get(name) for name in s.kernels
    }
    correctness = run_gates(
        under_test,
        device=device,
        sizes=gate_sizes or GateSizes(),
        B=B,
        T=max(Ts),
        H=H,
        Ds=Ds,
        dtype=dtype,
        exact=s.exact,
        show_progress=show_progress,
        log=log,
    )
    result = SuiteRun(s.name, info, correctness, tuning={"chosen": "each backend's own plan"})
    if not result.passed:
        log("[gate] a correctness gate is red: nothing is timed")
        return result
    result.records = time_grid(
        ops=ops or s.ops,
        Ts=Ts,
        Ds=Ds,
        B=B,
        H=H,
        dtype=dtype,
        modes=modes or s.modes,
        device=device,
        sequential_max_T=s.sequential_max_T if sequential_max_T is None else sequential_max_T,
        config=VLAConfig.exact() if s.exact else None,
        kernels=kernels,  # the suite's own kernels are timed through their usual entry point
        timer=timer,
        show_progress=show_progress,
        log=log,
    )
    return result


# -- reporting -----------------------------------------------------------------------------------


def format_table(records: Iterable[Record]) -> str:
    """One row per (D, T, mode), one column per op: median milliseconds ('-': not timed)."""
    records = list(records)
    ops = [o for o in OPS if any(r.op == o for r in records)]
    by: dict[tuple[int, int, str], dict[str, float]] = {}
    for r in records:
        by.setdefault((r.D, r.T, r.mode), {})[r.op] = r.median_ms
    width = max([12, *(len(o) + 1 for o in ops)])
    head = f"{'D':>4} {'T':>6} {'mode':7}" + "".join(f"{o:>{width}}" for o in ops)
    lines = ["median ms", head, "-" * len(head)]
    for (D, T, mode), row in sorted(by.items()):
        cells = "".join(f"{row[o]:{width}.3f}" if o in row else f"{'-':>{width}}" for o in ops)
        lines.append(f"{D:4d} {T:6d} {mode:7}{cells}")
    return "\n".join(lines)


def fitted_exponents(records: Iterable[Record]) -> dict[tuple[str, str, int], float]:
    """The least-squares slope p of log(median ms) against log(T), per (op, mode, D) with at
    least two lengths: time ~ T^p."""
    import numpy as np

    series: dict[tuple[str, str, int], dict[int, float]] = {}
    for r in records:
        series.setdefault((r.op, r.mode, r.D), {})[r.T] = r.median_ms
    out = {}
    for key, points in series.items():
        if len(points) >= 2:
            Ts = sorted(points)
            slope = np.polyfit(np.log([float(t) for t in Ts]), np.log([points[t] for t in Ts]), 1)
            out[key] = float(slope[0])
    return out


def plot_latency(run: SuiteRun, path: str | Path) -> Path | None:
    """Median latency against T on log-log axes, one panel per head width, one line per
    (op, mode) with its fitted exponent in the legend; ``None`` without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import NullLocator
    except ImportError:
        return None
    Ds = sorted({r.D for r in run.records})
    if not Ds:
        return None
    slopes = fitted_exponents(run.records)
    fig, axes = plt.subplots(1, len(Ds), figsize=(7.5 * len(Ds), 5.0), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, D in zip(axes[0], Ds, strict=True):
        for j, op in enumerate(o for o in OPS if any(r.op == o for r in run.records)):
            for mode, style in (("fwd", "-"), ("fwdbwd", "--")):
                pts = sorted(
                    (r.T, r.median_ms) for r in run.records if (r.op, r.mode, r.D) == (op, mode, D)
                )
                if not pts:
                    continue
                p = slopes.get((op, mode, D))
                mode_words = "forward" if mode == "fwd" else "forward + backward"
                label = f"{op}, {mode_words}" + (f" (time ∝ T^{p:.2f})" if p is not None else "")
                lengths, ms = zip(*pts, strict=True)
                ax.plot(
                    lengths, ms, style, color=colours[j % len(colours)], marker="o", label=label
                )
        Ts = sorted({r.T for r in run.records if r.D == D})
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(Ts, [f"{t // 1024}k" if t % 1024 == 0 else str(t) for t in Ts])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlabel("sequence length T (tokens)")
        ax.set_ylabel("median latency (milliseconds)")
        ax.set_title(f"head width D = {D}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    r0 = run.records[0]
    machine = run.machine.get("gpu") or "CPU"
    fig.suptitle(
        f"{run.suite} suite on {machine}: batch {r0.B}, {r0.H} heads, {r0.dtype} "
        f"(commit {run.machine.get('commit') or 'unknown'})"
    )
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return out


def write_outputs(run: SuiteRun, outdir: str | Path, *, plot: bool = True) -> dict[str, Path]:
    """``<suite>.json`` (and ``<suite>.png`` when timed and matplotlib is installed)."""
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    name = SUITES[run.suite].output if run.suite in SUITES else f"{run.suite}.json"
    files = {"json": out / name}
    files["json"].write_text(json.dumps(run.to_dict(), indent=1, default=str) + "\n")
    if plot and run.records:
        png = plot_latency(run, out / (Path(name).stem + ".png"))
        if png is not None:
            files["plot"] = png
    return files


def load_run(path: str | Path) -> SuiteRun:
    """A stored result (``{"machine", "records", "correctness", ...}``) as a :class:`SuiteRun`;
    a file without ``suite`` is taken for the ``grid`` suite's ``fused.json``."""
    data = json.loads(Path(path).read_text())
    return SuiteRun(
        data.get("suite", "grid"),
        data.get("machine", {}),
        data.get("correctness", {}),
        [Record(**r) for r in data.get("records", [])],
        data.get("tuning", {}),
    )


def replot(path: str | Path, outdir: str | Path) -> int:
    """Draw ``outdir/<name>.png`` of the stored result ``path``: 0, or 2 without matplotlib or
    records."""
    run = load_run(path)
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    png = plot_latency(run, out / (Path(path).stem + ".png"))
    if png is None:
        print(f"vla-verify bench: nothing drawn (no records in {path}, or no matplotlib)")
        return 2
    print(f"wrote plot: {png}")
    return 0


# -- command line --------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``vla-verify bench`` (and ``benchmarks/gpu/run.py``)."""
    lines = [f"{name}: {s.summary} (writes {s.output})" for name, s in SUITES.items()]
    parser.add_argument(
        "--suite", choices=list(SUITES), default="grid", help="; ".join(lines) + " (default grid)"
    )
    parser.add_argument("--T", type=int, nargs="+", help="sequence lengths (default: the suite's)")
    parser.add_argument("--D", type=int, nargs="+", help="head widths (default: the suite's)")
    parser.add_argument("--H", type=int, default=16, help="heads (default 16)")
    parser.add_argument("--B", type=int, default=1, help="batch (default 1)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument(
        "--modes", nargs="+", choices=["fwd", "fwdbwd"], help="default: the suite's"
    )
    parser.add_argument(
        "--ops",
        nargs="+",
        choices=list(OPS),
        metavar="OP",
        help=f"of {list(OPS)} (default: the suite's)",
    )
    parser.add_argument(
        "--sequential-max-T",
        type=int,
        help="time the torch sequential backend only up to this T (default: the suite's)",
    )
    parser.add_argument(
        "--examples", type=int, help="Hypothesis examples per validate gate (default 30)"
    )
    parser.add_argument(
        "--out", default=os.environ.get("OUT", "."), help="folder of the JSON and PNG ($OUT or .)"
    )
    parser.add_argument("--commit", help="the commit measured (default: git rev-parse HEAD)")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG")
    parser.add_argument(
        "--replot",
        metavar="JSON",
        help="time nothing: draw the PNG of a stored result (e.g. benchmarks/results/h200/"
        "fused.json) under --out",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="no GPU: tiny gates and the host clock on the CPU (tests the code path, measures "
        "nothing)",
    )


def main(args: argparse.Namespace) -> int:
    """Run one suite: exit 0 when its gates are green and it was timed, 1 on a red gate, 2 when
    it cannot run here (no GPU and no ``--cpu``, or the suite's backend is missing)."""
    if args.replot:
        return replot(args.replot, args.out)
    if args.cpu:  # before anything imports triton
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    from .backends import available

    s = SUITES[args.suite]
    if not args.cpu and not torch.cuda.is_available():
        print(
            "vla-verify bench: no CUDA GPU here; the benchmarks need one "
            "(--cpu runs the suite at tiny sizes on the CPU to test the code path)",
            file=sys.stderr,
        )
        return 2
    if s.requires is not None:
        status = {b.name: b for b in available()}.get(s.requires)
        if status is None or not status.available:
            why = status.reason if status is not None else "not registered"
            print(f"vla-verify bench: suite {s.name} needs {s.requires}: {why}", file=sys.stderr)
            return 2
    Ts, Ds, H = args.T, args.D, args.H
    if args.cpu:  # tiny sizes: the host clock at long T measures nothing and takes minutes
        Ts, Ds, H = Ts or (16, 32), Ds or (8,), min(H, 2)
    sizes = GateSizes.small() if args.cpu else GateSizes()
    if args.examples:
        sizes = GateSizes(
            examples=args.examples,
            wide_dk=sizes.wide_dk,
            wide_examples=sizes.wide_examples,
            grad_shapes=sizes.grad_shapes,
        )
    run = run_suite(
        s,
        Ts=Ts,
        Ds=Ds,
        B=args.B,
        H=H,
        dtype=args.dtype,
        modes=args.modes,
        ops=args.ops,
        sequential_max_T=args.sequential_max_T,
        device="cpu" if args.cpu else "cuda",
        gate_sizes=sizes,
        commit=args.commit,
        show_progress=not args.quiet,
    )
    files = write_outputs(run, args.out, plot=not args.no_plot)
    if run.records:
        print(format_table(run.records))
        for (op, mode, D), p in sorted(fitted_exponents(run.records).items()):
            print(f"  {op} {mode} D={D}: time ~ T^{p:.2f}")
    for kind, path in files.items():
        print(f"wrote {kind}: {path}")
    if not run.passed:
        print("a correctness gate is red: nothing was timed", file=sys.stderr)
        return 1
    return 0
