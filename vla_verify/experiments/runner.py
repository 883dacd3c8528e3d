"""The grid runner: cached, resumable results, one worker per GPU slot (torch imported lazily).

Each :class:`~.grids.Job` writes one JSON file, ``<results>/<grid>/<job key>.json``, holding the
job (task, model, training settings, seed, learning rate), what it measured (losses, validation
and test accuracy, state-norm probes) and its provenance (package versions, machine, git commit,
the backends that ran the mixers).  A job whose file exists is skipped, so a grid fills a piece
at a time; a file is written under a temporary name and renamed, so a killed run leaves no
half-written result.

Packing: small models leave a GPU mostly idle, so ``workers_per_device`` processes share each
visible GPU (``slots = GPUs × workers_per_device``, each process pinned to one GPU, with an equal
share of the CPU threads); on the CPU the jobs run in this process, one after another.  A
``time_budget_s`` stops workers from starting new jobs once it has passed, so a grid advances in
runs of bounded length and reports its completion.
"""

from __future__ import annotations

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
    "checkpoint_path",
    "execute_job",
    "pending",
    "provenance",
    "result_path",
    "run_grid",
]

#: The default results directory, relative to the repository root.
RESULTS_DIR = Path("experiments") / "results"
#: The prefix of a worker's report for a job that paused at the deadline.
PAUSED = "paused: "
#: Where a copy of the tree without ``.git`` (a GPU machine) reads its commit from.
COMMIT_ENV = "VLA_VERIFY_COMMIT"


def result_path(results_dir: Path, job: Job) -> Path:
    return Path(results_dir) / job.grid / f"{job.key()}.json"


def checkpoint_path(results_dir: Path, job: Job) -> Path:
    """Where a paused job keeps its training state (:class:`.train.TrainingPaused`)."""
    return Path(results_dir) / job.grid / "checkpoints" / f"{job.key()}.pt"


def pending(jobs: Sequence[Job], results_dir: Path) -> list[Job]:
    """The jobs whose result file does not exist yet."""
    return [job for job in jobs if not result_path(results_dir, job).is_file()]


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


def execute_job(
    job: Job,
    *,
    device: str = "cpu",
    progress: Callable[[int, int], None] | None = None,
    checkpoint: Path | None = None,
    deadline: float | None = None,
) -> dict[str, Any]:
    """Train (and probe) one job; return the result file's contents.  With ``checkpoint`` and
    ``deadline`` the training pauses at the deadline (:class:`.train.TrainingPaused`, raised)
    and a later call resumes it."""
    import torch

    from .model import Backbone, ModelConfig
    from .probe import state_norms
    from .tasks import make_task
    from .train import TrainConfig, train

    t0 = time.perf_counter()
    task = make_task(job.task, **job.task_params)
    model_cfg = ModelConfig(mixer=job.mixer, **job.model)
    train_cfg = TrainConfig(**{**job.train, "lr": job.lr if job.lr > 0 else 3e-4})
    torch.manual_seed(job.seed)
    device_type = device.split(":")[0]
    model = Backbone(model_cfg, device_type).to(device)
    result: dict[str, Any] = {
        "job": job.to_dict(),
        "key": job.key(),
        "model_config": model_cfg.to_dict(),
        "train_config": train_cfg.to_dict(),
        "task": {"name": job.task, **task.params()},
        "backends": model.backend_names,
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    if job.probe_T:
        result["probe_untrained"] = state_norms(model, job.probe_T, seed=job.seed, device=device)
    if train_cfg.steps:
        trained = train(
            model, task, train_cfg, seed=job.seed, device=device, progress=progress,
            checkpoint=checkpoint, deadline=deadline,
        )  # fmt: skip
        result.update(trained)
        if job.probe_T:
            result["probe_trained"] = state_norms(model, job.probe_T, seed=job.seed, device=device)
    result["seconds"] = time.perf_counter() - t0
    result["provenance"] = provenance(device)
    return result


def _worker(
    slot: int,
    device: str,
    jobs: Any,
    done: Any,
    results_dir: str,
    deadline: float,
    threads: int,
) -> None:
    """A worker process: take jobs from ``jobs`` until it is empty or the deadline passes; a
    job still training at the deadline pauses to its checkpoint."""
    import torch

    from .train import TrainingPaused

    torch.set_num_threads(threads)
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
        torch.backends.cuda.matmul.allow_tf32 = False  # float32 as the CPU computes it
    while time.time() < deadline:
        try:  # a short wait: the parent's queue feeder may not have flushed every job yet
            data = jobs.get(timeout=2)
        except queue.Empty:
            break
        job = Job.from_dict(data)
        try:
            result = execute_job(
                job, device=device, checkpoint=checkpoint_path(Path(results_dir), job),
                deadline=deadline,
            )  # fmt: skip
            _write_json(result_path(Path(results_dir), job), result)
            done.put((slot, job.key(), None))
        except TrainingPaused as paused:  # its checkpoint stays: a later run resumes it
            done.put((slot, job.key(), f"{PAUSED}{paused}"))
        except Exception as exc:  # one failed job must not stop the grid; it is reported
            done.put((slot, job.key(), f"{type(exc).__name__}: {exc}"))
    done.put((slot, None, None))


def run_grid(
    jobs: Sequence[Job],
    results_dir: Path = RESULTS_DIR,
    *,
    device: str = "cpu",
    workers_per_device: int = 1,
    time_budget_s: float | None = None,
    show_progress: bool = True,
) -> dict[str, Any]:
    """Run every pending job of ``jobs``; return ``{"total", "done_before", "ran", "failed",
    "paused", "pending", "errors"}``.  A job still training when ``time_budget_s`` ends pauses
    to :func:`checkpoint_path` and resumes there in a later run.  ``device`` ``"cpu"`` runs in
    this process; ``"cuda"`` starts ``workers_per_device`` processes per visible GPU."""
    results_dir = Path(results_dir)
    todo = pending(jobs, results_dir)
    summary: dict[str, Any] = {
        "total": len(jobs),
        "done_before": len(jobs) - len(todo),
        "ran": 0,
        "failed": 0,
        "errors": {},
    }
    deadline = time.time() + (time_budget_s if time_budget_s else float("inf"))
    bar = ProgressBar(f"grid on {device}", len(todo), enabled=show_progress)
    bar(0)
    if device == "cpu" and workers_per_device == 1:
        from .train import TrainingPaused

        summary["paused"] = 0
        for i, job in enumerate(todo):
            if time.time() >= deadline:
                break
            try:
                result = execute_job(
                    job, device="cpu", checkpoint=checkpoint_path(results_dir, job),
                    deadline=deadline,
                )  # fmt: skip
            except TrainingPaused:
                summary["paused"] += 1
                break
            _write_json(result_path(results_dir, job), result)
            summary["ran"] += 1
            bar(i + 1)
    elif device in ("cpu", "cuda"):
        summary.update(_run_pool(todo, results_dir, device, workers_per_device, deadline, bar))
    else:
        raise ConfigError("device", f"expected 'cpu' or 'cuda', got {device!r}")
    bar.close()
    summary["pending"] = len(pending(jobs, results_dir))
    return summary


def _run_pool(
    todo: Sequence[Job],
    results_dir: Path,
    device: str,
    per_device: int,
    deadline: float,
    bar: ProgressBar,
) -> dict[str, Any]:
    """``per_device`` spawned workers per visible GPU (or on the CPU), sharing one job queue."""
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
    jobs_q, done_q = ctx.Queue(), ctx.Queue()
    for job in todo:
        jobs_q.put(job.to_dict())
    threads = max(1, (os.cpu_count() or 1) // slots)
    procs = [
        ctx.Process(
            target=_worker,
            args=(
                s,
                devices[s % len(devices)],
                jobs_q,
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
    ran = failed = paused = finished = 0
    errors: dict[str, str] = {}
    while finished < slots:
        try:
            _slot, key, error = done_q.get(timeout=5)
        except queue.Empty:
            if not any(p.is_alive() for p in procs):
                break
            continue
        if key is None:
            finished += 1
        elif error is None:
            ran += 1
        elif error.startswith(PAUSED):
            paused += 1
        else:
            failed += 1
            errors[key] = error
        bar(ran + failed + paused)
    for p in procs:
        p.join(timeout=30)
    return {"ran": ran, "failed": failed, "paused": paused, "errors": errors, "slots": slots,
            "devices": devices}  # fmt: skip
