"""Training and evaluation of a backbone on a task (imports torch).

The recipe of spec §2.5: AdamW (``lr`` 3e-4, weight decay 0.01 on the matrices — embeddings and
projections — and none on LayerNorm gains and biases), gradient clipping at norm 1.0, a linear
warm-up over ``warmup_fraction`` of the steps, then a cosine decay to ``min_lr_fraction · lr``.
Every figure is configurable through :class:`TrainConfig`.

Data: step ``i`` trains on batch ``i`` of the task's seed (:mod:`.tasks`), so a run is a pure
function of its configuration and seed.  The validation set (model selection: the learning-rate
sweep) and the test set (the reported figures) are disjoint from every training batch.

Pausing.  A run longer than one sitting (one device call) pauses at a ``deadline``: it saves the
model, the optimiser, the step and the losses to a ``checkpoint`` file and raises
:class:`TrainingPaused`; called again with the same file it resumes at that step and trains on
the same batches, so a paused-and-resumed run gives the losses of one sitting.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import ConfigError
from .model import Backbone
from .tasks import IGNORE, TEST_INDEX, VALIDATION_INDEX, CopyTask, MQARTask

__all__ = ["TrainConfig", "TrainingPaused", "evaluate", "loss_fell", "lr_at", "train"]

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


def _param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.ndim >= 2 else no_decay).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def _loss(model: torch.nn.Module, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = model(tokens)
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE)


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


def train(
    model: Backbone | torch.nn.Module,
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
    "final_lr", "diverged", "sittings"}``.  ``progress(step, total)`` is called every 10 steps.
    ``checkpoint``: a file to resume from when it exists, and to pause to; ``deadline``: a
    ``time.time()`` after which the run pauses (:class:`TrainingPaused`; needs ``checkpoint``).
    The checkpoint is removed when the run completes.
    """
    if deadline is not None and checkpoint is None:
        raise ConfigError("deadline", "expected a checkpoint file to pause to")
    model.to(device).train()
    optimizer = torch.optim.AdamW(
        _param_groups(model, config.weight_decay), lr=config.lr, betas=(0.9, 0.999)
    )
    losses: list[float] = []
    first, elapsed, sittings = 0, 0.0, 1
    path = None if checkpoint is None else Path(checkpoint)
    if path is not None and path.is_file():
        saved = torch.load(path, map_location=device, weights_only=True)
        if saved["steps"] != config.steps:
            raise ConfigError("checkpoint", f"{path} is of a {saved['steps']}-step run")
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        first, losses = int(saved["step"]), list(saved["losses"])
        elapsed, sittings = float(saved["seconds"]), int(saved["sittings"]) + 1
    t0 = time.perf_counter()
    lr = config.lr
    for step in range(first, config.steps):
        lr = lr_at(step, config)
        for group in optimizer.param_groups:
            group["lr"] = lr
        data = task.batch(config.batch_size, seed, step)
        tokens = torch.as_tensor(data.tokens, device=device)
        targets = torch.as_tensor(data.targets, device=device)
        loss = _loss(model, tokens, targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if config.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        losses.append(float(loss.detach()))
        if not math.isfinite(losses[-1]):
            break  # a diverged run is a result (its accuracy is what it is), not a crash
        if progress is not None and step % 10 == 0:
            progress(step, config.steps)
        if deadline is not None and time.time() >= deadline and step + 1 < config.steps:
            assert path is not None
            _save_checkpoint(path, {
                "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "step": step + 1, "steps": config.steps, "losses": losses,
                "seconds": elapsed + time.perf_counter() - t0, "sittings": sittings,
            })  # fmt: skip
            raise TrainingPaused(step + 1, config.steps, path)
    seconds = elapsed + time.perf_counter() - t0
    if path is not None and path.is_file():
        path.unlink()

    def accuracy(index: int) -> float:
        return evaluate(
            model,
            task,
            seed=seed,
            index=index,
            samples=config.eval_samples,
            batch=config.eval_batch,
            device=device,
        )

    return {
        "losses": losses,
        "val_accuracy": accuracy(VALIDATION_INDEX),
        "test_accuracy": accuracy(TEST_INDEX),
        "train_seconds": seconds,
        "final_lr": lr,
        "diverged": bool(losses) and not math.isfinite(losses[-1]),
        "sittings": sittings,
    }
