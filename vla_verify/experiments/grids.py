"""The experiment grids: each point ``(task, model, size, seed, learning rate)`` is a :class:`Job`.

A job is identified by its :meth:`Job.key` (readable fields and a digest of the whole
configuration), which names its result file ``<results>/<grid>/<key>.json``; the runner skips a
job whose file exists, so a grid fills a piece at a time and resumes after any interruption.

Grids (``python -m vla_verify.experiments list`` prints them):

- ``mqar`` — the capacity curve: MQAR with ``n`` ∈ {24, 32, 8, 4, 16, 48, 64} pairs (n from 4 to
  2·d_h at d_h = 32; n = 24 and n = d_h first, the paper's figures), ``T`` = 256; n = 64
  needs more keys than a vocabulary of 128 holds, so it runs with a vocabulary of 256;
- ``mqar_length`` — n = 8 with ``T`` ∈ {512, 64, 128, 256, 1024, 2048} (T = 512 first);
- ``copy`` — copy with prefix lengths 16, 32, 64, 128, 256;
- ``state_norm`` — the untrained probe (no training) at T = 10⁴ for linear attention, DeltaNet
  and VLA; the trained probes come with the ``mqar`` jobs at n = 24;
- ``c10`` — only the cells of the paper's seven recall figures (MQAR n = 24 for every mixer,
  n = d_h = 32 for VLA, n = 8 at T = 512 for VLA and DeltaNet), as jobs of the ``mqar`` and
  ``mqar_length`` grids (their results land there), for one run that can give C10 its verdict;
- ``small`` — MQAR with n = 4 pairs, T = 24, at a CPU's scale (vocabulary 32, ``d_model`` 64,
  2 heads, FFN 128, 400 steps of 32 sequences, lr 3e-3): a pilot of the recall gap;
- ``tiny`` — every task and mixer at toy sizes (the format on a CPU in a minute or two).

The recall grids (``mqar``, ``mqar_length``, ``copy`` and so ``c10``) train with
:data:`RECIPE` (``--model short_conv=0 embedding_std=null`` restores the spec's backbone as
written).  Each training grid crosses the mixers (softmax, linear, deltanet, vla), the
learning rates (3e-4, 1e-3, 3e-3) and the seeds (0, 1, 2); softmax also runs with learned
position embeddings (:data:`MIXER_VARIANTS`).  Jobs are ordered so that a partial grid holds whole
groups of seeds for the paper's figures first.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import ConfigError

__all__ = ["DEFAULT_LRS", "DEFAULT_SEEDS", "GRIDS", "PAPER_MIXERS", "RECIPE", "Job", "grid_jobs"]

PAPER_MIXERS: tuple[str, ...] = ("vla", "deltanet", "linear", "softmax")
PROBE_MIXERS: tuple[str, ...] = ("vla", "deltanet", "linear")
DEFAULT_LRS: tuple[float, ...] = (3e-4, 1e-3, 3e-3)
DEFAULT_SEEDS: tuple[int, ...] = (0, 1, 2)
#: Extra model settings per mixer in the training grids: the spec's backbone has no position
#: embeddings, which leaves causal softmax attention without a way to find the token after a
#: key; learned positions give it one (the cell keeps whichever validates better).
MIXER_VARIANTS: dict[str, tuple[dict[str, Any], ...]] = {"softmax": ({}, {"positions": True})}


@dataclass(frozen=True)
class Job:
    """One point of a grid.  ``model`` and ``train`` hold overrides of
    :class:`~.model.ModelConfig` and :class:`~.train.TrainConfig`; ``probe_T`` > 0 adds the
    state-norm probe at that length (before and after training)."""

    grid: str
    task: str
    task_params: dict[str, int]
    mixer: str
    seed: int
    lr: float
    model: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)
    probe_T: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Job:
        return cls(**data)

    @property
    def group(self) -> tuple[Any, ...]:
        """What a job shares with its other seeds and learning rates (one table cell)."""
        return (
            self.task,
            tuple(sorted(self.task_params.items())),
            self.mixer,
            json.dumps(self.model, sort_keys=True),
            json.dumps(self.train, sort_keys=True),
        )

    def key(self) -> str:
        digest = hashlib.sha1(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:10]
        params = "-".join(f"{k}{v}" for k, v in sorted(self.task_params.items()))
        return f"{self.task}-{params}-{self.mixer}-lr{self.lr:g}-s{self.seed}-{digest}"


_PAPER_SIZE: dict[str, Any] = {}  # ModelConfig defaults: the spec §2.5 backbone
#: The training recipe of the recall grids, found on the ``c10`` cells (docs/experiments.md):
#: the standard DeltaNet layer's short causal convolutions on q, k, v (width 4) and embeddings
#: from N(0, 0.02²).  Without the convolutions no baseline leaves the MQAR plateau.
RECIPE: dict[str, Any] = {"short_conv": 4, "embedding_std": 0.02}
_TINY_MODEL: dict[str, Any] = {"d_model": 16, "n_heads": 2, "d_ffn": 32, "vocab": 24}
_TINY_TRAIN: dict[str, Any] = {"steps": 40, "batch_size": 16, "eval_samples": 64, "eval_batch": 64}


def _capacity_params(n: int) -> dict[str, int]:
    """MQAR at ``T`` = 256 with ``n`` pairs: the backbone's vocabulary of 128 holds 63 keys, so
    a larger ``n`` draws its keys and values from a vocabulary of 256."""
    params = {"n_pairs": n, "seq_len": 256}
    return params if n <= (128 - 2) // 2 else {**params, "vocab": 256}


def _cross(
    grid: str,
    task: str,
    params_list: list[dict[str, int]],
    mixers: tuple[str, ...],
    lrs: tuple[float, ...],
    seeds: tuple[int, ...],
    model: dict[str, Any],
    train: dict[str, Any],
    probe: dict[int, int] | None = None,
    variants: dict[str, tuple[dict[str, Any], ...]] | None = None,
) -> list[Job]:
    jobs = []
    for params in params_list:  # outermost: the first sizes are the paper's figures
        for seed in seeds:
            for lr in lrs:
                for mixer in mixers:
                    probe_T = 0
                    if probe and mixer in PROBE_MIXERS:
                        probe_T = probe.get(params.get("n_pairs", -1), 0)
                    settings = []
                    for variant in (variants or {}).get(mixer, ({},)):
                        setting = {**variant, **model}  # explicit overrides win
                        if "vocab" in params:  # the model reads the task's vocabulary
                            setting["vocab"] = params["vocab"]
                        if setting not in settings:
                            settings.append(setting)
                    for setting in settings:
                        jobs.append(
                            Job(
                                grid,
                                task,
                                dict(params),
                                mixer,
                                seed,
                                lr,
                                setting,
                                dict(train),
                                probe_T,
                            )
                        )
    return jobs


def grid_jobs(
    name: str,
    *,
    mixers: tuple[str, ...] | None = None,
    lrs: tuple[float, ...] | None = None,
    seeds: tuple[int, ...] | None = None,
    sizes: tuple[int, ...] | None = None,
    model: dict[str, Any] | None = None,
    train: dict[str, Any] | None = None,
) -> list[Job]:
    """The jobs of grid ``name`` (module docstring), optionally restricted.  ``sizes`` replaces
    the grid's sizes: n for ``mqar``, T for ``mqar_length``, the prefix length for ``copy``, T
    for ``state_norm``.  ``model``/``train`` add overrides to every job."""
    if name not in GRIDS:
        raise ConfigError("grid", f"expected one of {sorted(GRIDS)}, got {name!r}")
    seeds = DEFAULT_SEEDS if seeds is None else seeds
    lrs = DEFAULT_LRS if lrs is None else lrs
    extra_model = dict(model or {})
    extra_train = dict(train or {})
    if name == "mqar":
        ns = sizes or (24, 32, 8, 4, 16, 48, 64)
        return _cross(
            name,
            "mqar",
            [_capacity_params(n) for n in ns],
            mixers or PAPER_MIXERS,
            lrs,
            seeds,
            {**_PAPER_SIZE, **RECIPE, **extra_model},
            extra_train,
            probe={24: 10_000},
            variants=MIXER_VARIANTS,
        )
    if name == "mqar_length":
        Ts = sizes or (512, 64, 128, 256, 1024, 2048)
        return _cross(
            name,
            "mqar",
            [{"n_pairs": 8, "seq_len": T} for T in Ts],
            mixers or PAPER_MIXERS,
            lrs,
            seeds,
            {**_PAPER_SIZE, **RECIPE, **extra_model},
            extra_train,
            variants=MIXER_VARIANTS,
        )
    if name == "copy":
        Ls = sizes or (16, 32, 64, 128, 256)
        return _cross(
            name,
            "copy",
            [{"length": L} for L in Ls],
            mixers or PAPER_MIXERS,
            lrs,
            seeds,
            {**_PAPER_SIZE, **RECIPE, "max_len": 2 * max(Ls), **extra_model},
            extra_train,
            variants=MIXER_VARIANTS,
        )
    if name == "state_norm":
        Ts = sizes or (10_000,)
        return [
            Job(
                name,
                "mqar",
                {"n_pairs": 8, "seq_len": 64},
                mixer,
                seed,
                0.0,
                {**_PAPER_SIZE, **extra_model},
                {"steps": 0, **extra_train},
                T,
            )
            for T in Ts
            for seed in seeds
            for mixer in (mixers or PROBE_MIXERS)
        ]
    if name == "c10":

        def only(jobs: list[Job], keep: tuple[str, ...]) -> list[Job]:
            return [j for j in jobs if j.mixer in keep and (not mixers or j.mixer in mixers)]

        options: dict[str, Any] = dict(lrs=lrs, seeds=seeds, model=model, train=train)
        longest = only(grid_jobs("mqar_length", sizes=(512,), **options), ("vla", "deltanet"))
        return (
            longest
            + only(grid_jobs("mqar", sizes=(24,), **options), PAPER_MIXERS)
            + only(grid_jobs("mqar", sizes=(32,), **options), ("vla",))
        )
    if name == "small":
        small_model = {"vocab": 32, "d_model": 64, "n_heads": 2, "d_ffn": 128, "max_len": 64}
        small_train = {"steps": 400, "batch_size": 32, "eval_samples": 256}
        return _cross(
            name,
            "mqar",
            [{"n_pairs": n, "seq_len": 24, "vocab": 32} for n in (sizes or (4,))],
            mixers or PAPER_MIXERS,
            lrs if lrs is not DEFAULT_LRS else (3e-3,),
            seeds,
            {**small_model, **extra_model},
            {**small_train, **extra_train},
            variants=MIXER_VARIANTS,
        )
    # tiny: every task and mixer at toy sizes (CPU), the trained probe included
    vocab = {"vocab": _TINY_MODEL["vocab"]}
    tiny_model = {**_TINY_MODEL, **extra_model}
    tiny_train = {**_TINY_TRAIN, **extra_train}
    lrs = lrs if lrs is not DEFAULT_LRS else (1e-2,)
    mixers = mixers or PAPER_MIXERS
    return _cross(
        name,
        "mqar",
        [{"n_pairs": 4, "seq_len": 16, **vocab}],
        mixers,
        lrs,
        seeds,
        tiny_model,
        tiny_train,
        probe={4: 200},
    ) + _cross(name, "copy", [{"length": 6, **vocab}], mixers, lrs, seeds, tiny_model, tiny_train)


GRIDS: tuple[str, ...] = ("mqar", "mqar_length", "copy", "state_norm", "c10", "small", "tiny")
