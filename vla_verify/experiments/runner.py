"""The grid runner: cached, resumable results, one worker per GPU slot (torch imported lazily).

Each :class:`~.grids.Job` writes one JSON file, ``<results>/<grid>/<job key>.json``, holding the
job (task, model, training settings, seed, learning rate), what it measured (losses, validation
and test accuracy, state-norm probes) and its provenance (package versions, machine, git commit,
the backends that ran the mixers).  A job whose file exists is skipped, so a grid fills a piece
at a time; a file is written under a temporary name and renamed, so a killed run leaves no
half-written result.

Packing: small models leave a GPU mostly idle.  The jobs of a grid that differ only in seed and
learning rate train in stacks (:func:`stacks`): one process runs ``stack`` backbones as one
:class:`~.stacked.StackedBackbone`, so their kernels run together rather than taking turns.
On top of that ``workers_per_device`` processes share each visible GPU (``slots = GPUs ×
workers_per_device``, each process pinned to one GPU, with an equal share of the CPU threads);
on the CPU the stacks run in this process, one after another.  A ``time_budget_s`` stops
workers from starting new stacks once it has passed, so a grid advances in runs of bounded
length and reports its completion.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import queue
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..progress import ProgressBar
from .grids import Job

__all__ = [
    "COMMIT_ENV",
    "PAUSED",
    "RESULTS_DIR",
    "adopt_equivalents",
    "checkpoint_path",
    "execute_job",
    "execute_jobs",
    "pending",
    "provenance",
    "result_path",
    "run_grid",
    "stack_cost",
    "stacks",
]

#: The default results directory, relative to the repository root.
RESULTS_DIR = Path("experiments") / "results"
#: The prefix of a worker's report for a job that paused at the deadline.
PAUSED = "paused: "
#: Where a copy of the tree without ``.git`` (a GPU machine) reads its commit from.
COMMIT_ENV = "VLA_VERIFY_COMMIT"


def result_path(results_dir: Path, job: Job) -> Path:
    return Path(results_dir) / job.grid / f"{job.key()}.json"


def checkpoint_path(results_dir: Path, jobs: Job | Sequence[Job]) -> Path:
    """Where a paused job, or a paused stack of jobs, keeps its training state
    (:class:`.train.TrainingPaused`): named by the job's key, a stack's by a digest of its
    members' keys."""
    members = [jobs] if isinstance(jobs, Job) else list(jobs)
    if len(members) == 1:
        name = members[0].key()
    else:
        keys = "\n".join(job.key() for job in members)
        name = f"stack{len(members)}-{hashlib.sha1(keys.encode()).hexdigest()[:12]}"
    return Path(results_dir) / members[0].grid / "checkpoints" / f"{name}.pt"


def stacks(jobs: Sequence[Job], size: int) -> list[list[Job]]:
    """``jobs`` in stacks of at most ``size`` that train together: the jobs of one stack share
    everything but the seed and the learning rate (:attr:`.grids.Job.group`).  Deterministic,
    in the order of ``jobs``, so a paused stack is formed again by the next run."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ConfigError("stack", f"expected a stack size >= 1, got {size!r}")
    groups: dict[tuple[Any, ...], list[Job]] = {}
    for job in jobs:
        groups.setdefault((job.grid, job.group), []).append(job)
    return [group[i : i + size] for group in groups.values() for i in range(0, len(group), size)]


def pending(jobs: Sequence[Job], results_dir: Path) -> list[Job]:
    """The jobs whose result file does not exist yet."""
    return [job for job in jobs if not result_path(results_dir, job).is_file()]


def _experiment(job: dict[str, Any]) -> str:
    """What a job trains and measures: everything but the grid that lists it."""
    return json.dumps({k: v for k, v in job.items() if k != "grid"}, sort_keys=True)


def adopt_equivalents(jobs: Sequence[Job], results_dir: Path) -> list[Job]:
    """Give each pending job of ``jobs`` the result of the same experiment run for another grid.

    Grids overlap: MQAR with ``n`` = 8 at ``T`` = 256 is a point of the capacity grid
    (``mqar``) and of the length grid (``mqar_length``), the same task, model, training,
    seed and learning rate; only the grid's name (and so the result file's key) differs.
    Such a job's file is written as a copy of the other's, with the job rewritten and
    ``"same_as"`` naming the file measured.  Returns the jobs so given a result."""
    results_dir = Path(results_dir)
    waiting = {_experiment(job.to_dict()): job for job in pending(jobs, results_dir)}
    adopted: list[Job] = []
    if not waiting:
        return adopted
    tasks = tuple({job.task for job in waiting.values()})
    for path in sorted(results_dir.glob("*/*.json")):
        # A result file's name starts with its task: other tasks' files are not read.
        if path.name == "manifest.json" or not path.name.startswith(tasks):
            continue
        try:
            data = json.loads(path.read_text())
            experiment = _experiment(data["job"])
        except (ValueError, KeyError, TypeError):
            continue  # not a result file
        job = waiting.pop(experiment, None)
        if job is None:
            continue
        copy = {**data, "job": job.to_dict(), "key": job.key()}
        copy["same_as"] = data.get("same_as", f"{path.parent.name}/{path.name}")
        _write_json(result_path(results_dir, job), copy)
        adopted.append(job)
        if not waiting:
            break
    return adopted


def _commit() -> str | None:
    if os.environ.get(COMMIT_ENV):
        return os.environ[COMMIT_ENV]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def provenance(device: str) -> dict[str, Any]:
    """Versions, machine and commit for a result file."""
    import numpy
    import torch

    from .. import __version__

    info: dict[str, Any] = {
        "vla_verify": __version__,
        "commit": _commit(),
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "platform": platform.platform(),
        "cpu_threads": torch.get_num_threads(),
        "device": device,
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    try:
        import fla

        info["fla"] = getattr(fla, "__version__", "unknown")
    except ImportError:
        info["fla"] = None
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        info["gpu"] = props.name
        info["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
    return info


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, allow_nan=True) + "\n")
    tmp.replace(path)


def execute_jobs(
    jobs: Sequence[Job],
    *,
    device: str = "cpu",
    progress: Callable[[int, int], None] | None = None,
    checkpoint: Path | None = None,
    deadline: float | None = None,
) -> list[dict[str, Any]]:
    """Train (and probe) a stack of jobs (:func:`stacks`) side by side; return each job's
    result file contents.  With ``checkpoint`` and ``deadline`` the training pauses at the
    deadline (:class:`.train.TrainingPaused`, raised) and a later call resumes it."""
    import torch

    from .model import Backbone, ModelConfig
    from .probe import state_norms
    from .tasks import make_task
    from .train import TrainConfig, train_members

    if not jobs or len({(job.grid, job.group) for job in jobs}) != 1:
        raise ConfigError("jobs", "expected jobs that differ in seed and learning rate only")
    t0 = time.perf_counter()
    first = jobs[0]
    task = make_task(first.task, **first.task_params)
    model_cfg = ModelConfig(mixer=first.mixer, **first.model)
    train_cfgs = [
        TrainConfig(**{**job.train, "lr": job.lr if job.lr > 0 else 3e-4}) for job in jobs
    ]
    device_type = device.split(":")[0]
    members = []
    for job in jobs:
        torch.manual_seed(job.seed)  # each member starts as its job would alone
        members.append(Backbone(model_cfg, device_type).to(device))
    results: list[dict[str, Any]] = [
        {
            "job": job.to_dict(),
            "key": job.key(),
            "model_config": model_cfg.to_dict(),
            "train_config": cfg.to_dict(),
            "task": {"name": job.task, **task.params()},
            "backends": member.backend_names,
            "parameters": sum(p.numel() for p in member.parameters()),
        }
        for job, cfg, member in zip(jobs, train_cfgs, members, strict=True)
    ]
    for job, member, result in zip(jobs, members, results, strict=True):
        if job.probe_T:
            result["probe_untrained"] = state_norms(
                member, job.probe_T, seed=job.seed, device=device
            )
    if train_cfgs[0].steps:
        trained = train_members(
            members, task, train_cfgs[0], seeds=[job.seed for job in jobs],
            lrs=[cfg.lr for cfg in train_cfgs], device=device, progress=progress,
            checkpoint=checkpoint, deadline=deadline,
        )  # fmt: skip
        for job, member, result, outcome in zip(jobs, members, results, trained, strict=True):
            result.update(outcome)
            result["stacked_with"] = [other.key() for other in jobs if other is not job]
            if job.probe_T:
                result["probe_trained"] = state_norms(
                    member, job.probe_T, seed=job.seed, device=device
                )
    seconds = time.perf_counter() - t0
    info = provenance(device)
    for result in results:
        result["seconds"] = seconds
        result["provenance"] = info
    return results


def execute_job(
    job: Job,
    *,
    device: str = "cpu",
    progress: Callable[[int, int], None] | None = None,
    checkpoint: Path | None = None,
    deadline: float | None = None,
) -> dict[str, Any]:
    """:func:`execute_jobs` for one job."""
    (result,) = execute_jobs(
        [job], device=device, progress=progress, checkpoint=checkpoint, deadline=deadline
    )
    return result


def stack_cost(stack: Sequence[Job]) -> int:
    """A stack's work per training step in member-tokens (members × sequence length): the
    order in which :func:`run_grid` starts stacks (the jobs of one run train as many steps)."""
    from .tasks import make_task

    first = stack[0]
    return len(stack) * make_task(first.task, **first.task_params).seq_len


def _run_stack(stack: Sequence[Job], device: str, results_dir: Path, deadline: float) -> str | None:
    """Run one stack and write its results; return None, or what stopped it (a paused stack
    keeps its checkpoint for the next run; any other error is the stack's failure)."""
    from .train import TrainingPaused

    try:
        results = execute_jobs(
            stack, device=device, checkpoint=checkpoint_path(results_dir, stack),
            deadline=deadline,
        )  # fmt: skip
    except TrainingPaused as paused:
        return f"{PAUSED}{paused}"
    except Exception as exc:  # one failed stack must not stop the grid; it is reported
        return f"{type(exc).__name__}: {exc}"
    for job, result in zip(stack, results, strict=True):
        _write_json(result_path(results_dir, job), result)
    return None


def _worker(
    slot: int,
    device: str,
    work: Any,
    done: Any,
    results_dir: str,
    deadline: float,
    threads: int,
) -> None:
    """A worker process: take stacks from ``work`` until it is empty or the deadline passes;
    a stack still training at the deadline pauses to its checkpoint."""
    import torch

    torch.set_num_threads(threads)
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
        torch.backends.cuda.matmul.allow_tf32 = False  # float32 as the CPU computes it
    while time.time() < deadline:
        try:  # a short wait: the parent's queue feeder may not have flushed every stack yet
            data = work.get(timeout=2)
        except queue.Empty:
            break
        stack = [Job.from_dict(d) for d in data]
        outcome = _run_stack(stack, device, Path(results_dir), deadline)
        done.put((slot, [job.key() for job in stack], outcome))
    done.put((slot, None, None))


def run_grid(
    jobs: Sequence[Job],
    results_dir: Path = RESULTS_DIR,
    *,
    device: str = "cpu",
    workers_per_device: int = 1,
    stack: int = 1,
    time_budget_s: float | None = None,
    show_progress: bool = True,
    priority: Callable[[Job], int] | None = None,
) -> dict[str, Any]:
    """Run every pending job of ``jobs``; return ``{"total", "done_before", "adopted", "ran",
    "failed", "paused", "pending", "errors", "stacks"}`` (counts of jobs).  A job whose
    experiment another grid has already run takes that result (:func:`adopt_equivalents`).
    Jobs train in stacks of at most ``stack`` (:func:`stacks`, :mod:`.stacked`), in order of
    ``priority(job)`` (lowest first; e.g. the line of a plan), within a priority the costliest
    first (:func:`stack_cost`).  A stack still training when ``time_budget_s`` ends pauses to
    :func:`checkpoint_path` and resumes there in a later run (formed again from the same
    pending jobs).  ``device`` ``"cpu"`` with one worker runs in
    this process; otherwise ``workers_per_device`` processes per visible GPU (or on the CPU)."""
    results_dir = Path(results_dir)
    done_before = len(jobs) - len(pending(jobs, results_dir))
    adopted = adopt_equivalents(jobs, results_dir)
    todo = pending(jobs, results_dir)
    rank = priority or (lambda job: 0)
    # Within a priority the longest stacks first: the workers then finish together instead of
    # the last one starting a long stack as the others fall idle.
    work = sorted(stacks(todo, stack), key=lambda s: (rank(s[0]), -stack_cost(s)))
    summary: dict[str, Any] = {
        "total": len(jobs),
        "done_before": done_before,
        "adopted": len(adopted),
        "stacks": len(work),
    }
    deadline = time.time() + (time_budget_s if time_budget_s else float("inf"))
    bar = ProgressBar(f"grid on {device}", len(todo), enabled=show_progress)
    bar(0)
    if device not in ("cpu", "cuda"):
        raise ConfigError("device", f"expected 'cpu' or 'cuda', got {device!r}")
    if device == "cpu" and workers_per_device == 1:
        outcomes = []
        for members in work:
            if time.time() >= deadline:
                break
            outcome = _run_stack(members, "cpu", results_dir, deadline)
            outcomes.append(([job.key() for job in members], outcome))
            _tally(outcomes, bar)
            if outcome is not None and outcome.startswith(PAUSED):
                break
        summary.update(_tally(outcomes, bar))
    else:
        summary.update(_run_pool(work, results_dir, device, workers_per_device, deadline, bar))
    bar.close()
    summary["pending"] = len(pending(jobs, results_dir))
    return summary


def _tally(
    outcomes: Sequence[tuple[list[str], str | None]], bar: ProgressBar | None = None
) -> dict[str, Any]:
    """Jobs ran, failed and paused from the stacks' outcomes (the progress bar counts jobs)."""
    ran = failed = paused = 0
    errors: dict[str, str] = {}
    for keys, outcome in outcomes:
        if outcome is None:
            ran += len(keys)
        elif outcome.startswith(PAUSED):
            paused += len(keys)
        else:
            failed += len(keys)
            errors.update(dict.fromkeys(keys, outcome))
    if bar is not None:
        bar(ran + failed + paused)
    return {"ran": ran, "failed": failed, "paused": paused, "errors": errors}


def _run_pool(
    work: Sequence[Sequence[Job]],
    results_dir: Path,
    device: str,
    per_device: int,
    deadline: float,
    bar: ProgressBar,
) -> dict[str, Any]:
    """``per_device`` spawned workers per visible GPU (or on the CPU), sharing one queue of
    stacks."""
    import multiprocessing as mp

    if per_device < 1:
        raise ConfigError("workers_per_device", f"expected >= 1, got {per_device}")
    if device == "cuda":
        import torch

        gpus = torch.cuda.device_count()
        if gpus < 1:
            raise ConfigError("device", "expected a visible CUDA GPU for --device cuda")
        devices = [f"cuda:{i}" for i in range(gpus)]
    else:
        devices = ["cpu"]
    slots = len(devices) * per_device
    ctx = mp.get_context("spawn")
    work_q, done_q = ctx.Queue(), ctx.Queue()
    for members in work:
        work_q.put([job.to_dict() for job in members])
    threads = max(1, (os.cpu_count() or 1) // slots)
    procs = [
        ctx.Process(
            target=_worker,
            args=(
                s,
                devices[s % len(devices)],
                work_q,
                done_q,
                str(results_dir),
                deadline,
                threads,
            ),
        )
        for s in range(slots)
    ]
    for p in procs:
        p.start()
    outcomes: list[tuple[list[str], str | None]] = []
    finished = 0
    while finished < slots:
        try:
            _slot, keys, outcome = done_q.get(timeout=5)
        except queue.Empty:
            if not any(p.is_alive() for p in procs):
                break
            continue
        if keys is None:
            finished += 1
        else:
            outcomes.append((keys, outcome))
            _tally(outcomes, bar)
    for p in procs:
        p.join(timeout=30)
    return {**_tally(outcomes), "slots": slots, "devices": devices}
