"""Synthetic recall tasks (spec §3 C10): documented generators with fixed seeds (NumPy only).

Every task yields a :class:`Batch` of next-token-prediction examples: ``tokens`` ``[N, T]``
int64 inputs and ``targets`` ``[N, T]`` int64, where ``targets[i, t]`` is the token the model
must emit after reading ``tokens[i, : t + 1]``, or :data:`IGNORE` where nothing is scored.
Accuracy (:func:`exact_match`) is the fraction of scored positions whose arg-max prediction equals
the target — the exact-match accuracy over query positions of the MQAR literature.

A batch is a pure function of ``(task parameters, seed, index)``: the ``index``-th training batch
of seed ``s`` is drawn from ``numpy.random.default_rng([s, index])``, so a run can stop and resume
at any step and two runs with the same seed see the same data.  Evaluation sets use indices from
:data:`VALIDATION_INDEX` and :data:`TEST_INDEX`, which no training step reaches.

Vocabulary layout (``vocab`` V, default 128, the backbone's of spec §2.5): token 0 is padding,
token 1 the copy task's separator; MQAR keys are drawn from ``[2, 2 + (V - 2) // 2)`` and values
from the rest, so a key never equals a value and predicting the current input scores 0.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..errors import ConfigError, ShapeError

__all__ = [
    "IGNORE",
    "PAD",
    "SEPARATOR",
    "TASKS",
    "TEST_INDEX",
    "VALIDATION_INDEX",
    "Batch",
    "CopyTask",
    "MQARTask",
    "exact_match",
    "make_task",
]

IGNORE = -100  # torch.nn.functional.cross_entropy's default ignore_index
PAD = 0
SEPARATOR = 1
VALIDATION_INDEX = 2**40  # batch indices of the validation set (model selection)
TEST_INDEX = 2**41  # batch indices of the test set (reported figures)


@dataclass(frozen=True)
class Batch:
    """``tokens`` and ``targets``, both ``[N, T]`` int64 (``targets`` is :data:`IGNORE` where
    nothing is scored)."""

    tokens: np.ndarray
    targets: np.ndarray

    @property
    def scored(self) -> int:
        """The number of scored positions."""
        return int((self.targets != IGNORE).sum())


def _positive(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ConfigError(name, f"expected an integer >= {minimum}, got {value!r}")
    return int(value)


def exact_match(predictions: np.ndarray, targets: np.ndarray) -> float:
    """The fraction of scored positions (``targets != IGNORE``) where ``predictions`` (arg-max
    token ids, ``[N, T]``) equal ``targets``."""
    predictions, targets = np.asarray(predictions), np.asarray(targets)
    if predictions.shape != targets.shape:
        raise ShapeError(
            "predictions", f"expected the targets' shape {targets.shape}, got {predictions.shape}"
        )
    scored = targets != IGNORE
    if not scored.any():
        raise ShapeError("targets", "expected at least one scored position")
    return float((predictions[scored] == targets[scored]).mean())


@dataclass(frozen=True)
class MQARTask:
    """Multi-query associative recall.

    A sequence of length ``seq_len`` opens with ``n_pairs`` key–value pairs ``k_1 v_1 … k_n v_n``
    (distinct keys, values drawn with replacement), followed by ``seq_len − 2n`` positions of
    padding in which every key is asked once, in random order, at random positions.  The target
    at a query's position is that key's value; nothing else is scored.  So the model must store
    n associations and recall each after a gap that grows with ``seq_len``.
    """

    n_pairs: int = 8
    seq_len: int = 64
    vocab: int = 128

    name = "mqar"

    def __post_init__(self) -> None:
        n = _positive("n_pairs", self.n_pairs)
        _positive("vocab", self.vocab, 6)
        n_keys = (self.vocab - 2) // 2
        if n > n_keys:
            raise ConfigError("n_pairs", f"expected at most {n_keys} keys for vocab {self.vocab}")
        if _positive("seq_len", self.seq_len) < 3 * n:
            raise ConfigError(
                "seq_len", f"expected >= 3·n_pairs = {3 * n} (pairs, then one query per key)"
            )

    def params(self) -> dict[str, int]:
        return asdict(self)

    def batch(self, n_samples: int, seed: int, index: int) -> Batch:
        """The ``index``-th batch of ``n_samples`` examples for ``seed`` (module docstring)."""
        N, n, T = _positive("n_samples", n_samples), self.n_pairs, self.seq_len
        rng = np.random.default_rng([int(seed), int(index)])
        n_keys = (self.vocab - 2) // 2
        keys = np.argsort(rng.random((N, n_keys)), axis=1)[:, :n] + 2
        values = rng.integers(2 + n_keys, self.vocab, size=(N, n))
        tokens = np.full((N, T), PAD, dtype=np.int64)
        targets = np.full((N, T), IGNORE, dtype=np.int64)
        tokens[:, 0 : 2 * n : 2] = keys
        tokens[:, 1 : 2 * n : 2] = values
        gap = T - 2 * n
        rows = np.arange(N)[:, None]
        # n distinct query slots among the gap's positions, and the order in which keys are asked.
        slots = np.sort(np.argsort(rng.random((N, gap)), axis=1)[:, :n], axis=1) + 2 * n
        order = np.argsort(rng.random((N, n)), axis=1)
        tokens[rows, slots] = keys[rows, order]
        targets[rows, slots] = values[rows, order]
        return Batch(tokens, targets)


@dataclass(frozen=True)
class CopyTask:
    """Copy: a random prefix of ``length`` tokens from ``[2, vocab)``, the separator, and the
    prefix again; the model reads the first ``seq_len = 2·length`` of these ``2·length + 1``
    tokens.  The targets are the second copy: after reading the separator and ``j`` copied tokens
    the model must emit prefix token ``j + 1``.  The token
    to emit is never the current input (a model that repeats its input scores about 1/vocab).
    """

    length: int = 16
    vocab: int = 128

    name = "copy"

    def __post_init__(self) -> None:
        _positive("length", self.length)
        _positive("vocab", self.vocab, 4)

    @property
    def seq_len(self) -> int:
        return 2 * self.length

    def params(self) -> dict[str, int]:
        return asdict(self)

    def batch(self, n_samples: int, seed: int, index: int) -> Batch:
        N, L = _positive("n_samples", n_samples), self.length
        rng = np.random.default_rng([int(seed), int(index)])
        prefix = rng.integers(2, self.vocab, size=(N, L))
        tokens = np.concatenate(
            [prefix, np.full((N, 1), SEPARATOR), prefix[:, :-1]], axis=1
        ).astype(np.int64)
        targets = np.full((N, self.seq_len), IGNORE, dtype=np.int64)
        targets[:, L : 2 * L] = prefix
        return Batch(tokens, targets)


TASKS: dict[str, type[MQARTask] | type[CopyTask]] = {"mqar": MQARTask, "copy": CopyTask}


def make_task(name: str, **params: int) -> MQARTask | CopyTask:
    """The task ``name`` (``"mqar"`` or ``"copy"``) with its parameters."""
    if name not in TASKS:
        raise ConfigError("task", f"expected one of {sorted(TASKS)}, got {name!r}")
    return TASKS[name](**params)
