"""Training and evaluation of a backbone on a task (imports torch).

The recipe of spec §2.5: AdamW (``lr`` 3e-4, weight decay 0.01 on the matrices — embeddings and
projections — and none on LayerNorm gains and biases), gradient clipping at norm 1.0, a linear
warm-up over ``warmup_fraction`` of the steps, then a cosine decay to ``min_lr_fraction · lr``.
Every figure is configurable through :class:`TrainConfig`.

Data: step ``i`` trains on batch ``i`` of the task's seed (:mod:`.tasks`), so a run is a pure
function of its configuration and seed.  The validation set (model selection: the learning-rate
sweep) and the test set (the reported figures) are disjoint from every training batch.

Stacks.  :func:`train_stacked` trains several backbones of one configuration side by side as
one :class:`~.stacked.StackedBackbone` (each with its own seed, data, learning rate, clipping and
optimiser state); :func:`train` is a stack of one.  On a GPU the host reads the losses back
every few steps (:func:`_sync_interval`) rather than after each, so it queues work ahead of the
device.

Pausing.  A run longer than one sitting (one device call) pauses at a ``deadline``: it saves the
model, the optimiser, the step and the losses to a ``checkpoint`` file and raises
:class:`TrainingPaused`; called again with the same file it resumes at that step and trains on
the same batches, so a paused-and-resumed run gives the losses of one sitting.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import ConfigError, NonFiniteError
from .model import Backbone
from .stacked import StackedAdamW, StackedBackbone, clip_grad_norms
from .tasks import IGNORE, TEST_INDEX, VALIDATION_INDEX, CopyTask, MQARTask

__all__ = [
    "TrainConfig",
    "TrainingPaused",
    "evaluate",
    "loss_fell",
    "lr_at",
    "train",
    "train_members",
    "train_stacked",
]

Task = MQARTask | CopyTask


class TrainingPaused(Exception):
    """A run stopped at its deadline after ``step`` of ``steps`` steps, its state saved to
    ``checkpoint`` (module docstring, "Pausing")."""

    def __init__(self, step: int, steps: int, checkpoint: Path) -> None:
        super().__init__(f"paused after step {step} of {steps}; state in {checkpoint}")
        self.step, self.steps, self.checkpoint = step, steps, checkpoint


def _save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save(state, tmp)
    tmp.replace(path)  # never a half-written checkpoint


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings (module docstring); the defaults are the spec §2.5 recipe."""

    steps: int = 2000
    batch_size: int = 64
    lr: float = 3e-4
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    warmup_fraction: float = 0.1
    min_lr_fraction: float = 0.1
    eval_samples: int = 512
    eval_batch: int = 128
    #: ``torch.set_float32_matmul_precision`` on a GPU while the stack trains: ``"highest"``
    #: (float32 products, as the CPU computes them) or ``"high"`` (TF32 tensor-core products:
    #: 10-bit mantissas, float32 accumulation; several times faster).  The recurrent mixers'
    #: kernels compute in float32 either way.
    matmul_precision: str = "highest"

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "eval_samples", "eval_batch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(name, f"expected an integer >= 0, got {value!r}")
        if not self.lr > 0:
            raise ConfigError("lr", f"expected a positive learning rate, got {self.lr!r}")
        for name in ("warmup_fraction", "min_lr_fraction"):
            if not 0 <= getattr(self, name) <= 1:
                raise ConfigError(name, f"expected a fraction in [0, 1], got {getattr(self, name)}")
        if self.matmul_precision not in ("highest", "high"):
            raise ConfigError(
                "matmul_precision", f"expected 'highest' or 'high', got {self.matmul_precision!r}"
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def lr_at(step: int, config: TrainConfig) -> float:
    """The learning rate of step ``step`` (0-based): linear warm-up, then cosine decay."""
    warmup = max(1, round(config.warmup_fraction * config.steps))
    if step < warmup:
        return config.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, config.steps - warmup)
    floor = config.min_lr_fraction
    return config.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def _loss(model: torch.nn.Module, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The mean cross-entropy of one backbone over the scored positions."""
    logits = _at_least_float32(model(tokens))
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE)


def _at_least_float32(x: torch.Tensor) -> torch.Tensor:
    """The loss is never computed in a 16-bit type (a float64 model keeps float64)."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _member_losses(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Each member's mean cross-entropy over its scored positions: logits ``[M, B, T, V]``,
    targets ``[M, B, T]`` -> ``[M]`` (what :func:`_loss` gives each member alone)."""
    M = targets.shape[0]
    per_token = F.cross_entropy(
        _at_least_float32(logits).flatten(0, 2),
        targets.flatten(),
        ignore_index=IGNORE,
        reduction="none",
    ).view(M, -1)
    scored = (targets != IGNORE).view(M, -1).sum(1).clamp_min(1)
    return per_token.sum(1) / scored


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    task: Task,
    *,
    seed: int,
    index: int,
    samples: int,
    batch: int,
    device: str,
) -> float:
    """Exact-match accuracy over the scored positions of ``samples`` examples drawn from batch
    indices ``index, index + 1, …`` of ``seed`` (:func:`vla_verify.experiments.tasks.exact_match`
    pooled over every batch)."""
    model.eval()
    correct = scored = 0
    for i, start in enumerate(range(0, samples, batch)):
        data = task.batch(min(batch, samples - start), seed, index + i)
        tokens = torch.as_tensor(data.tokens, device=device)
        predictions = model(tokens).argmax(-1).cpu().numpy()
        mask = data.targets != IGNORE
        correct += int((predictions[mask] == data.targets[mask]).sum())
        scored += int(mask.sum())
    model.train()
    return correct / max(scored, 1)


def loss_fell(losses: list[float], *, window: int = 10, factor: float = 0.8) -> bool:
    """True when the mean loss of the last ``window`` steps is below ``factor`` times that of
    the first ``window`` (the smoke test's check that training trains)."""
    if len(losses) < 2 * window:
        raise ConfigError("losses", f"expected at least {2 * window} steps, got {len(losses)}")
    return float(np.mean(losses[-window:])) < factor * float(np.mean(losses[:window]))


def _batches(
    task: Task, config: TrainConfig, seeds: Sequence[int], first: int, count: int, device: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Training batches ``first … first + count − 1`` of every member's seed, uploaded at once:
    tokens and targets ``[count, M, B, T]`` int64."""
    data = [
        [task.batch(config.batch_size, seed, first + i) for seed in seeds] for i in range(count)
    ]
    tokens = np.stack([[b.tokens for b in row] for row in data])
    targets = np.stack([[b.targets for b in row] for row in data])
    return torch.as_tensor(tokens, device=device), torch.as_tensor(targets, device=device)


@contextlib.contextmanager
def _matmul_precision(precision: str, cuda: bool) -> Iterator[None]:
    """``torch.set_float32_matmul_precision(precision)`` on a GPU for the duration (restored
    after); the CPU's products stay as they are."""
    before = torch.get_float32_matmul_precision()
    if cuda:
        torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def _sync_interval(members: int, config: TrainConfig, seq_len: int, device: str) -> int:
    """Steps between host syncs (loss read-back, divergence check, batch upload): every step on
    the CPU, where nothing runs ahead; on a GPU as many as keep one upload near 2²² tokens (at
    most 50), so the host queues steps ahead of the device instead of waiting on each."""
    if device == "cpu":
        return 1
    return max(1, min(50, 2**22 // max(1, members * config.batch_size * seq_len)))


def train_stacked(
    model: StackedBackbone,
    task: Task,
    config: TrainConfig,
    *,
    seeds: Sequence[int],
    lrs: Sequence[float] | None = None,
    device: str = "cpu",
    progress: Callable[[int, int], None] | None = None,
    checkpoint: Path | str | None = None,
    deadline: float | None = None,
) -> list[dict[str, Any]]:
    """Train the ``M`` members of ``model`` side by side, member ``m`` on the batches of
    ``seeds[m]`` with peak learning rate ``lrs[m]`` (default ``config.lr``); return per member
    ``{"losses", "train_seconds", "final_lr", "diverged", "sittings"}``.

    Each member follows the recipe of the module docstring as if alone: its own loss, gradient
    clipping and AdamW (:mod:`.stacked`).  A member whose loss or gradient norm stops being
    finite has diverged: its losses end at that step, its parameters are zeroed and its learning
    rate is 0 from then on, and the others train on.  ``progress(step, total)`` is called every
    10 steps; ``checkpoint`` and ``deadline`` pause and resume the whole stack (module
    docstring, "Pausing").
    """
    M = model.members
    seeds = [int(s) for s in seeds]
    peak = [float(config.lr)] * M if lrs is None else [float(x) for x in lrs]
    if len(seeds) != M or len(peak) != M:
        raise ConfigError("seeds", f"expected {M} seeds and learning rates, got {seeds}, {peak}")
    if deadline is not None and checkpoint is None:
        raise ConfigError("deadline", "expected a checkpoint file to pause to")
    if model.flat.device.type != torch.device(device).type:
        raise ConfigError(
            "device", f"expected the stack's device {model.flat.device}, got {device!r}"
        )
    model.train()
    optimizer = StackedAdamW(
        model.flat, model.flat_grad, model.matrix_mask, weight_decay=config.weight_decay
    )
    losses: list[list[float]] = [[] for _ in range(M)]
    diverged = [False] * M
    first, elapsed, sittings = 0, 0.0, 1
    path = None if checkpoint is None else Path(checkpoint)
    if path is not None and path.is_file():
        saved = torch.load(path, map_location=device, weights_only=True)
        if saved["steps"] != config.steps or saved["seeds"] != seeds or saved["lrs"] != peak:
            raise ConfigError(
                "checkpoint",
                f"{path} is of a {saved['steps']}-step run of seeds {saved['seeds']} at learning "
                f"rates {saved['lrs']}",
            )
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        first, losses, diverged = int(saved["step"]), saved["losses"], saved["diverged"]
        elapsed, sittings = float(saved["seconds"]), int(saved["sittings"]) + 1
    peak_lrs = torch.tensor(peak, dtype=optimizer.lr.dtype, device=optimizer.lr.device)
    live = torch.tensor([not d for d in diverged], device=optimizer.lr.device)
    interval = _sync_interval(M, config, task.seq_len, device)
    pending: list[tuple[torch.Tensor, torch.Tensor]] = []  # (losses [M], grad norms [M])

    def retire(m: int) -> None:
        diverged[m] = True
        live[m] = False
        optimizer.reset_member(m)

    def flush() -> None:
        """Read back the queued steps' losses; retire the members that diverged."""
        if not pending:
            return
        step_losses = torch.stack([lo for lo, _ in pending]).double().cpu().numpy()
        norms = torch.stack([n for _, n in pending]).double().cpu().numpy()
        pending.clear()
        for m in range(M):
            if diverged[m]:
                continue
            for value, norm in zip(step_losses[:, m], norms[:, m], strict=True):
                losses[m].append(float(value))
                if not (math.isfinite(value) and math.isfinite(norm)):
                    retire(m)
                    break

    t0 = time.perf_counter()
    step = first
    tokens = targets = torch.empty(0)
    with _matmul_precision(config.matmul_precision, model.flat.is_cuda):
        while step < config.steps and not all(diverged):
            offset = (step - first) % interval
            if offset == 0:
                count = min(interval, config.steps - step)
                tokens, targets = _batches(task, config, seeds, step, count, device)
            # The schedule is one curve scaled by each member's peak (lr_at is linear in lr).
            optimizer.lr.copy_(peak_lrs * (lr_at(step, config) / config.lr) * live)
            try:
                step_losses = _member_losses(model(tokens[offset]), targets[offset])
            except NonFiniteError:
                # A diverged member's NaNs reached a mixer that checks its inputs before the
                # next read-back: retire it now and take the step again.
                retired = sum(diverged)
                flush()
                # Parameters gone non-finite with no loss to show it yet:
                for m in torch.nonzero(~model.flat.isfinite().all(1)).flatten().tolist():
                    if not diverged[m]:
                        losses[m].append(math.nan)
                        retire(m)
                if sum(diverged) == retired:
                    raise
                continue
            optimizer.zero_grad()
            with warnings.catch_warnings():
                # The gradients are strided views of one buffer (.stacked): by design.
                warnings.filterwarnings("ignore", message="grad and param do not obey")
                step_losses.sum().backward()  # the members share no parameter: each gets its own
            norms = clip_grad_norms(model.flat_grad, config.grad_clip)
            optimizer.step()
            pending.append((step_losses.detach(), norms))
            step += 1
            if (step - first) % interval == 0 or step == config.steps:
                flush()
            if progress is not None and (step - 1) % 10 == 0:
                progress(step - 1, config.steps)
            if deadline is not None and time.time() >= deadline and step < config.steps:
                assert path is not None
                flush()
                _save_checkpoint(path, {
                    "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "step": step, "steps": config.steps, "losses": losses, "diverged": diverged,
                    "seeds": seeds, "lrs": peak,
                    "seconds": elapsed + time.perf_counter() - t0, "sittings": sittings,
                })  # fmt: skip
                raise TrainingPaused(step, config.steps, path)
    flush()
    seconds = elapsed + time.perf_counter() - t0
    if path is not None and path.is_file():
        path.unlink()
    last = lr_at(max(step - 1, 0), config) / config.lr
    return [
        {
            "losses": losses[m],
            "train_seconds": seconds,
            "final_lr": peak[m] * last,
            "diverged": diverged[m],
            "sittings": sittings,
        }
        for m in range(M)
    ]


def train_members(
    members: Sequence[Backbone],
    task: Task,
    config: TrainConfig,
    *,
    seeds: Sequence[int],
    lrs: Sequence[float] | None = None,
    device: str = "cpu",
    progress: Callable[[int, int], None] | None = None,
    checkpoint: Path | str | None = None,
    deadline: float | None = None,
) -> list[dict[str, Any]]:
    """Train the backbones ``members`` (one configuration) side by side
    (:func:`train_stacked`), write the trained parameters back into them, and evaluate each:
    the results of :func:`train`, one per member, each with ``stack`` = ``M``."""
    for member in members:
        member.to(device)
    stacked = StackedBackbone(members)
    outcomes = train_stacked(
        stacked, task, config, seeds=seeds, lrs=lrs, device=device, progress=progress,
        checkpoint=checkpoint, deadline=deadline,
    )  # fmt: skip
    stacked.write_back(members)
    results = []
    for member, seed, outcome in zip(members, seeds, outcomes, strict=True):

        def accuracy(index: int, member: Backbone = member, seed: int = seed) -> float:
            return evaluate(
                member,
                task,
                seed=seed,
                index=index,
                samples=config.eval_samples,
                batch=config.eval_batch,
                device=device,
            )

        results.append(
            {
                **outcome,
                "val_accuracy": accuracy(VALIDATION_INDEX),
                "test_accuracy": accuracy(TEST_INDEX),
                "stack": len(members),
            }
        )
    return results


def train(
    model: Backbone,
    task: Task,
    config: TrainConfig,
    *,
    seed: int,
    device: str = "cpu",
    progress: Callable[[int, int], None] | None = None,
    checkpoint: Path | str | None = None,
    deadline: float | None = None,
) -> dict[str, Any]:
    """Train ``model`` on ``task`` for ``config.steps`` steps; return the losses and accuracies.

    Returns ``{"losses": [...], "val_accuracy", "test_accuracy", "train_seconds",
    "final_lr", "diverged", "sittings", "stack"}``.  ``progress(step, total)`` is called every
    10 steps.  ``checkpoint``: a file to resume from when it exists, and to pause to;
    ``deadline``: a ``time.time()`` after which the run pauses (:class:`TrainingPaused`; needs
    ``checkpoint``).  The checkpoint is removed when the run completes.  A stack of one
    (:func:`train_members`).
    """
    (result,) = train_members(
        [model], task, config, seeds=[seed], device=device, progress=progress,
        checkpoint=checkpoint, deadline=deadline,
    )  # fmt: skip
    return result
