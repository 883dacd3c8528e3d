"""Hypothesis strategies for VLA inputs that reach the hard corners (spec §1–§2).

A drawn :class:`Case` holds float64 NumPy arrays in the layouts of spec §1.  Sizes and *regimes*
are drawn by Hypothesis (so they shrink: fewer tokens, narrower heads, the plainest regime);
the array values come from a NumPy generator seeded by a drawn integer, which keeps generation
fast at the lengths where recurrences go wrong.

Regimes (the first of each list is the plainest, the one shrinking moves towards):

- keys: ``gaussian``; ``positive`` (ELU+1 features, as the layer of spec §2.5 feeds);
  ``near_parallel`` (all keys within an angle 1e-3…1e-1 of one direction); ``repeated`` (two keys
  used over and over); ``scaled`` (norms from 1e-3 to 1e3, so normalisation matters).
- penalties ``u``: ``layer`` (``normalize(W_u k_raw)/sqrt(dk)``, spec §2.5); ``gaussian``;
  ``concentrated`` (a few axis directions with magnitudes up to 3e2: condition numbers of ``M_t``
  up to ~1e8); ``tiny`` (1e-6); ``zero``.
- queries: ``positive``; ``signed`` (``z·q`` crosses zero, so the read-out floor acts); ``tiny``
  (``z·q`` below ``out_eps``).
- values: ``gaussian``; ``large`` (×1e2).
- initial state: none; ``spd`` (a random SPD ``A``, random ``S``, positive ``z``);
  ``indefinite`` (a symmetric indefinite ``A``, which drives the Sherman–Morrison denominator to
  its floor ``sm_floor``).

Further corners, first-class options outside the defaults of :func:`cases` (which
``validate`` draws from): keys ``unit`` and ``near_parallel_tight`` (angles 1e-3…1e-2);
penalties ``ill_conditioned`` (``κ(M_T)`` log-uniform up to 1e8); queries ``cancelling``
(``z_t·q_t`` within ±out_eps of 0); values ``bounded`` (``||v|| <= 1``) and ``unit``.  Presets:
:func:`hard_cases` (all of them), :func:`claim_cases` (the hypotheses of one claim of spec §3),
:func:`bounded_cases` (claim C5), :func:`long_cases` (T in the hundreds or thousands, behind a
parameter).  :func:`safe_target` feeds ``hypothesis.target`` for adversarial search.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import strategies as st

from ..spec import VLAConfig

__all__ = [
    "ALL_KEY_REGIMES",
    "ALL_PENALTY_REGIMES",
    "ALL_QUERY_REGIMES",
    "ALL_VALUE_REGIMES",
    "KEY_REGIMES",
    "PENALTY_REGIMES",
    "QUERY_REGIMES",
    "STATE_REGIMES",
    "VALUE_REGIMES",
    "Case",
    "ConformanceSizes",
    "ShapeBounds",
    "bounded_cases",
    "carry_splits",
    "cases",
    "claim_cases",
    "conformance_cases",
    "hard_cases",
    "ill_conditioned_penalties",
    "initial_states",
    "long_cases",
    "near_parallel_keys",
    "safe_target",
    "swept_configs",
]

# The default regimes of ``cases`` (what ``validate`` draws from; unchanged so that validation
# runs stay comparable).  The ``ALL_*`` tuples add the further corners, first-class
# options for the property tests: pass them as ``key_regimes=...`` etc.
KEY_REGIMES = ("gaussian", "positive", "near_parallel", "repeated", "scaled")
PENALTY_REGIMES = ("layer", "gaussian", "concentrated", "tiny", "zero")
QUERY_REGIMES = ("positive", "signed", "tiny")
VALUE_REGIMES = ("gaussian", "large")
STATE_REGIMES = ("none", "spd", "indefinite")

#: ``unit``: unit keys (the hypothesis of claim C5); ``near_parallel_tight``: unit keys at angles
#: 1e-3…1e-2 from one direction.
ALL_KEY_REGIMES = (*KEY_REGIMES, "unit", "near_parallel_tight")
#: ``ill_conditioned``: ``κ(M_T)`` log-uniform up to 1e8 (:func:`ill_conditioned_penalties`).
ALL_PENALTY_REGIMES = (*PENALTY_REGIMES, "ill_conditioned")
#: ``cancelling``: ``z_t·q_t`` within ±out_eps of zero (the read-out floor decides the output).
ALL_QUERY_REGIMES = (*QUERY_REGIMES, "cancelling")
#: ``bounded``: ``||v_t|| <= 1`` (the hypothesis of claim C5); ``unit``: ``||v_t|| = 1``.
ALL_VALUE_REGIMES = (*VALUE_REGIMES, "bounded", "unit")


@dataclass(frozen=True)
class ShapeBounds:
    """Largest sizes a strategy draws.  ``max_T=None`` picks a length that covers several
    nudge periods of the configuration (three periods plus a few tokens)."""

    max_B: int = 2
    max_H: int = 2
    max_T: int | None = None
    max_dk: int = 8
    max_dv: int = 8
    min_T: int = 1

    def length_for(self, config: VLAConfig) -> int:
        if self.max_T is not None:
            return self.max_T
        if config.nudge_period is not None:
            return max(3 * config.nudge_period + 3, 24)
        return 40


@dataclass(frozen=True)
class Case:
    """One drawn input: float64 arrays (spec §1 layouts) and how they were made."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    u: np.ndarray
    initial_state: tuple[np.ndarray, np.ndarray, np.ndarray] | None
    split: int  # 1 <= split < T when T >= 2: where a state-carry check cuts the sequence
    regimes: dict[str, str] = field(default_factory=dict)
    seed: int = 0

    @property
    def shapes(self) -> tuple[int, int, int, int, int]:
        B, T, H, dk = self.q.shape
        return B, T, H, dk, self.v.shape[-1]

    def describe(self) -> str:
        B, T, H, dk, dv = self.shapes
        regimes = ", ".join(f"{k}={v}" for k, v in self.regimes.items())
        return f"B={B} T={T} H={H} dk={dk} dv={dv}; {regimes}; seed={self.seed}"

    def arrays(self) -> dict[str, Any]:
        """The inputs by name, for reports and counterexample files."""
        out: dict[str, Any] = {"q": self.q, "k": self.k, "v": self.v, "u": self.u}
        if self.initial_state is not None:
            out.update(zip(("S0", "A0", "z0"), self.initial_state, strict=True))
        return out


def _elu_plus_one(x: np.ndarray) -> np.ndarray:
    return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def make_keys(rng: np.random.Generator, regime: str, shape: tuple[int, ...]) -> np.ndarray:
    B, T, H, dk = shape
    if regime == "gaussian":
        return rng.standard_normal(shape)
    if regime == "positive":
        return _elu_plus_one(rng.standard_normal(shape))
    if regime == "near_parallel":
        base = _unit(rng.standard_normal((B, 1, H, dk)))
        angle = 10.0 ** rng.uniform(-3, -1, size=(B, T, H, 1))
        wiggle = _unit(rng.standard_normal(shape)) * angle
        return (base + wiggle) * 10.0 ** rng.uniform(-1, 1, size=(B, T, H, 1))
    if regime == "repeated":
        pool = rng.standard_normal((B, 2, H, dk))
        return pool[:, rng.integers(0, 2, size=T)]
    if regime == "scaled":
        return rng.standard_normal(shape) * 10.0 ** rng.uniform(-3, 3, size=(B, T, H, 1))
    if regime == "unit":
        return _unit(rng.standard_normal(shape))
    if regime == "near_parallel_tight":
        return near_parallel_keys(rng, shape, log10_angle=rng.uniform(-3, -2), unit=True)
    raise ValueError(f"unknown key regime {regime!r}")


def make_penalties(
    rng: np.random.Generator, regime: str, shape: tuple[int, ...], k_raw: np.ndarray
) -> np.ndarray:
    B, T, H, dk = shape
    if regime == "layer":
        W_u = rng.standard_normal((H, dk, dk)) / np.sqrt(dk)
        projected = np.einsum("hij,bthj->bthi", W_u, k_raw)
        norm = np.maximum(np.linalg.norm(projected, axis=-1, keepdims=True), 1e-12)
        return projected / norm / np.sqrt(dk)
    if regime == "gaussian":
        return rng.standard_normal(shape)
    if regime == "concentrated":
        axes = rng.integers(0, min(dk, 2), size=(B, T, H))
        magnitude = 10.0 ** rng.uniform(-1, 2.5, size=(B, T, H))
        return np.eye(dk)[axes] * magnitude[..., None]
    if regime == "tiny":
        return 1e-6 * rng.standard_normal(shape)
    if regime == "zero":
        return np.zeros(shape)
    if regime == "ill_conditioned":
        return ill_conditioned_penalties(rng, shape, log10_cond=rng.uniform(0.0, 8.0))
    raise ValueError(f"unknown penalty regime {regime!r}")


def make_queries(rng: np.random.Generator, regime: str, shape: tuple[int, ...]) -> np.ndarray:
    if regime == "positive":
        return _elu_plus_one(rng.standard_normal(shape))
    if regime == "signed":
        return rng.standard_normal(shape)
    if regime == "tiny":
        return 1e-7 * _elu_plus_one(rng.standard_normal(shape))
    raise ValueError(f"unknown query regime {regime!r}")


def ill_conditioned_penalties(
    rng: np.random.Generator,
    shape: tuple[int, ...],
    *,
    log10_cond: float,
    lambda0: float = 0.1,
    directions: int = 2,
) -> np.ndarray:
    """Penalties concentrated in ``directions`` fixed unit directions (per batch and head), whose
    accumulated penalty ``M_T = lambda0·I + Σ u uᵀ`` has condition number about
    ``10**log10_cond`` at the end of the sequence (spec §3 C1; the issue's "condition numbers to
    1e8").  ``[B, T, H, dk]`` float64.

    The total weight ``(cond − 1)·lambda0`` is split evenly over the ``T`` tokens, each token
    penalising one of the directions (drawn at random), so ``κ(M_t)`` grows with ``t`` and reaches
    ``cond/2 … cond`` when the whole sequence is in (the most-drawn direction carries half of the
    weight or more).  With ``dk <= directions`` every direction is
    penalised and the condition number is set by how unevenly they were drawn, so smaller.
    """
    B, T, H, dk = shape
    n = max(1, min(directions, dk))
    basis = np.linalg.qr(rng.standard_normal((B, H, dk, dk)))[0][..., :n]  # [B, H, dk, n]
    which = rng.integers(0, n, size=(B, T, H))
    total = (10.0**log10_cond - 1.0) * lambda0
    per_token = np.sqrt(total / T)
    b_idx, h_idx = np.meshgrid(np.arange(B), np.arange(H), indexing="ij")
    out = np.empty(shape)
    for t in range(T):
        out[:, t] = basis[b_idx, h_idx, :, which[:, t]] * per_token
    return out


def near_parallel_keys(
    rng: np.random.Generator,
    shape: tuple[int, ...],
    *,
    log10_angle: float,
    unit: bool = False,
) -> np.ndarray:
    """Keys within an angle ``10**log10_angle`` radians of one direction per (batch, head), with
    norms spread over 1e-1…1e1 (so normalisation matters) or unit (``unit=True``):
    ``[B, T, H, dk]`` float64.

    With ``dk = 1`` every key is parallel (angle 0) whatever is asked.
    """
    B, T, H, dk = shape
    base = _unit(rng.standard_normal((B, 1, H, dk)))
    wiggle = rng.standard_normal(shape)
    wiggle = wiggle - np.sum(wiggle * base, axis=-1, keepdims=True) * base  # ⟂ base
    norm = np.linalg.norm(wiggle, axis=-1, keepdims=True)
    wiggle = np.where(norm > 0, wiggle / np.where(norm > 0, norm, 1.0), 0.0)
    angle = 10.0**log10_angle * rng.uniform(0.5, 1.0, size=(B, T, H, 1))
    keys = np.cos(angle) * base + np.sin(angle) * wiggle
    if unit:
        return _unit(keys)
    return keys * 10.0 ** rng.uniform(-1, 1, size=(B, T, H, 1))


def make_values(rng: np.random.Generator, regime: str, shape: tuple[int, ...]) -> np.ndarray:
    """Values ``[B, T, H, dv]``: ``gaussian``, ``large`` (×1e2), ``bounded`` (``||v|| <= 1``),
    ``unit`` (``||v|| = 1``)."""
    if regime == "gaussian":
        return rng.standard_normal(shape)
    if regime == "large":
        return 100.0 * rng.standard_normal(shape)
    if regime == "unit":
        return _unit(rng.standard_normal(shape))
    if regime == "bounded":
        return _unit(rng.standard_normal(shape)) * rng.uniform(0.0, 1.0, size=(*shape[:-1], 1))
    raise ValueError(f"unknown value regime {regime!r}")


def cancelling_queries(
    rng: np.random.Generator, k: np.ndarray, z0: np.ndarray, out_eps: float
) -> np.ndarray:
    """Queries with ``z_t·q_t`` within ``±out_eps`` of zero, ``z_t = z_0 + Σ_{s<=t} k_s`` (spec
    §2.3 read-out): a random vector with its component along ``z_t`` replaced by a tiny signed
    one, so the read-out floor ``max(z·q, out_eps)`` decides the output.  ``[B, T, H, dk]``."""
    z = z0[:, None] + np.cumsum(k, axis=1)  # [B, T, H, dk]
    r = rng.standard_normal(k.shape)
    zz = np.sum(z * z, axis=-1, keepdims=True)
    safe = np.where(zz > 0, zz, 1.0)
    target = out_eps * rng.uniform(-1.0, 1.0, size=(*k.shape[:-1], 1))
    along = (target - np.sum(r * z, axis=-1, keepdims=True)) / safe
    return np.where(zz > 0, r + along * z, r)


def make_state(
    rng: np.random.Generator, regime: str, B: int, H: int, dk: int, dv: int, lambda0: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    if regime == "none":
        return None
    S = rng.standard_normal((B, H, dv, dk))
    G = rng.standard_normal((B, H, dk, dk))
    if regime == "spd":
        M = lambda0 * np.eye(dk) + G @ np.swapaxes(G, -1, -2)
        A = np.linalg.inv(M)
        A = 0.5 * (A + np.swapaxes(A, -1, -2))
    elif regime == "indefinite":
        A = 0.5 * (G + np.swapaxes(G, -1, -2))
    else:
        raise ValueError(f"unknown state regime {regime!r}")
    z = _elu_plus_one(rng.standard_normal((B, H, dk))) * rng.integers(1, 20)
    return S, A, z


@st.composite
def cases(
    draw: st.DrawFn,
    config: VLAConfig | None = None,
    bounds: ShapeBounds | None = None,
    *,
    key_regimes: tuple[str, ...] = KEY_REGIMES,
    penalty_regimes: tuple[str, ...] = PENALTY_REGIMES,
    query_regimes: tuple[str, ...] = QUERY_REGIMES,
    value_regimes: tuple[str, ...] = VALUE_REGIMES,
    state_regimes: tuple[str, ...] = STATE_REGIMES,
) -> Case:
    """Draw a :class:`Case`: sizes, regimes, and a seed for the values (module docstring)."""
    config = VLAConfig() if config is None else config
    bounds = ShapeBounds() if bounds is None else bounds
    max_T = bounds.length_for(config)
    B = draw(st.integers(1, bounds.max_B), label="B")
    H = draw(st.integers(1, bounds.max_H), label="H")
    # Half the draws are short (where off-by-one bugs show), half reach the longest length.
    T = draw(
        st.one_of(
            st.integers(bounds.min_T, max(bounds.min_T, min(8, max_T))),
            st.integers(bounds.min_T, max_T),
        ),
        label="T",
    )
    dk = draw(st.integers(1, bounds.max_dk), label="dk")
    dv = draw(st.integers(1, bounds.max_dv), label="dv")
    return _draw_values(
        draw,
        config,
        (B, T, H, dk, dv),
        st.integers(1, T - 1) if T >= 2 else st.just(1),
        key_regimes=key_regimes,
        penalty_regimes=penalty_regimes,
        query_regimes=query_regimes,
        value_regimes=value_regimes,
        state_regimes=state_regimes,
    )


def _draw_values(
    draw: st.DrawFn,
    config: VLAConfig,
    shapes: tuple[int, int, int, int, int],
    splits: st.SearchStrategy[int],
    *,
    key_regimes: tuple[str, ...],
    penalty_regimes: tuple[str, ...],
    query_regimes: tuple[str, ...],
    value_regimes: tuple[str, ...],
    state_regimes: tuple[str, ...],
) -> Case:
    """The regimes, the value seed and the split of a case whose sizes are drawn; the arrays."""
    B, T, H, dk, dv = shapes
    regimes = {
        "keys": draw(st.sampled_from(key_regimes), label="keys"),
        "penalties": draw(st.sampled_from(penalty_regimes), label="penalties"),
        "queries": draw(st.sampled_from(query_regimes), label="queries"),
        "values": draw(st.sampled_from(value_regimes), label="values"),
        "initial_state": draw(st.sampled_from(state_regimes), label="initial_state"),
    }
    seed = draw(st.integers(0, 2**32 - 1), label="seed")
    split = draw(splits, label="split") if T >= 2 else 1
    rng = np.random.default_rng(seed)
    shape = (B, T, H, dk)
    k_raw = rng.standard_normal(shape)
    k = make_keys(rng, regimes["keys"], shape)
    u = make_penalties(rng, regimes["penalties"], shape, k_raw)
    v = make_values(rng, regimes["values"], (B, T, H, dv))
    state = make_state(rng, regimes["initial_state"], B, H, dk, dv, config.lambda0)
    if regimes["queries"] == "cancelling":
        z0 = np.zeros((B, H, dk)) if state is None else state[2]
        q = cancelling_queries(rng, k, z0, config.out_eps)
    else:
        q = make_queries(rng, regimes["queries"], shape)
    return Case(q, k, v, u, state, split, regimes, seed)


# -- the conformance checker's sizes (what ``validate`` draws by default) ----------------------

#: The widths kernels tile their key and value blocks by, and ragged widths beside them (a
#: masked last block, a block count that is not a power of two).  Ascending, so that shrinking
#: within a list moves to the narrowest width that still fails.
TILE_WIDTHS = (16, 32, 64, 128)
RAGGED_WIDTHS = (17, 31, 33, 48, 63, 65, 96, 100, 127)
#: Chunk lengths of chunked kernels (spec §5) that lengths and carry cuts aim at by default.
CHUNK_MARKS = (64, 128, 16, 32)


@dataclass(frozen=True)
class ConformanceSizes:
    """Largest sizes :func:`conformance_cases` draws (spec §1 layouts).

    ``max_dk``/``max_dv``: head widths (``max_dv=None``: as ``max_dk``); ``head_dims``: the only
    widths ``dk`` and ``dv`` take instead (a kernel's supported head widths, the first the one
    shrinking moves to; ``max_dk``/``max_dv`` then unused); ``max_T``: tokens;
    ``max_batch``: ``B·H``; ``chunk_size``: a chunked kernel's chunk length ``C``, which lengths
    and carry cuts aim at (multiples of ``C`` and ``C ± 1``).  ``max_work`` caps
    ``B·H·T·dk·max(dk, dv)`` (the oracle's cost per run) by shortening ``T``, never below two
    chunks and a token, so that the widest heads still cross chunk boundaries.
    """

    max_dk: int = 128
    max_dv: int | None = None
    max_T: int = 640
    max_batch: int = 6
    chunk_size: int | None = None
    max_work: int = 640 * 64 * 64
    head_dims: tuple[int, ...] | None = None

    @property
    def marks(self) -> tuple[int, ...]:
        """The periods lengths and cuts aim at, repeated by weight: a declared ``C`` about three
        times in four (first, so that shrinking moves to it), else 64 half the time."""
        if self.chunk_size is None:
            return CHUNK_MARKS
        others = tuple(m for m in CHUNK_MARKS if m != self.chunk_size)
        return (self.chunk_size,) * 6 + others


def _weighted(draw: st.DrawFn, options: list[tuple[str, int]], label: str) -> str:
    """One of ``options`` (name, weight) drawn with those weights; shrinks to the first."""
    names = [name for name, weight in options for _ in range(weight) if weight > 0]
    return draw(st.sampled_from(names), label=label)


def _width(draw: st.DrawFn, largest: int, label: str) -> int:
    """A head width: small (shrinks well) half the time, else a tiling width, a ragged one, or
    any width up to ``largest``."""
    tiles = [w for w in TILE_WIDTHS if w <= largest]
    ragged = [w for w in RAGGED_WIDTHS if w <= largest]
    kind = _weighted(
        draw,
        [
            ("small", 5),
            ("tile", 2 if tiles else 0),
            ("ragged", 2 if ragged else 0),
            ("any", 1 if largest > 8 else 0),
        ],
        f"{label}_kind",
    )
    if kind == "tile":
        return draw(st.sampled_from(tiles), label=label)
    if kind == "ragged":
        return draw(st.sampled_from(ragged), label=label)
    if kind == "any":
        return draw(st.integers(9, largest), label=label)
    return draw(st.integers(1, min(8, largest)), label=label)


def _near_marks(draw: st.DrawFn, marks: tuple[int, ...], low: int, high: int, label: str) -> int:
    """A value at or beside a multiple of one of ``marks`` (``m·P + {0, 1, −1}``), in
    ``[low, high]``; the declared chunk length (first mark) is drawn half the time."""
    usable = [m for m in marks if m <= high] or [max(1, high)]
    period = draw(
        st.sampled_from([usable[0]] * max(1, len(usable) - 1) + usable[1:]), label=f"{label}_P"
    )
    multiple = draw(st.integers(1, max(1, high // period)), label=f"{label}_m")
    offset = draw(st.sampled_from((1, 0, -1)), label=f"{label}_offset")
    return int(min(max(multiple * period + offset, low), high))


def _length(draw: st.DrawFn, sizes: ConformanceSizes) -> int:
    """A sequence length: short most often; else beside chunk boundaries, any length past one
    chunk of 128, or anywhere up to 130."""
    top = sizes.max_T
    kind = _weighted(
        draw,
        [("short", 4), ("medium", 2), ("boundary", 3), ("long", 1 if top > 129 else 0)],
        "T_kind",
    )
    if kind == "medium":
        return draw(st.integers(1, min(130, top)), label="T")
    if kind == "boundary":
        return _near_marks(draw, sizes.marks, 1, top, "T")
    if kind == "long":
        return draw(st.integers(129, top), label="T")
    return draw(st.integers(1, min(16, top)), label="T")


def _batch_heads(draw: st.DrawFn, largest: int) -> tuple[int, int]:
    """``(B, H)`` with ``B·H <= largest``: one slice most often, else two by two, or many batch
    elements (B > 2), or many heads (H > 2)."""
    kind = _weighted(
        draw,
        [
            ("single", 4),
            ("pairs", 2 if largest >= 2 else 0),
            ("batch", 2 if largest >= 3 else 0),
            ("heads", 2 if largest >= 3 else 0),
        ],
        "BH_kind",
    )
    if kind == "pairs":
        return draw(st.integers(1, 2), label="B"), draw(
            st.integers(1, max(1, min(2, largest // 2))), label="H"
        )
    if kind == "batch":
        B = draw(st.integers(3, largest), label="B")
        return B, draw(st.integers(1, largest // B), label="H")
    if kind == "heads":
        H = draw(st.integers(3, largest), label="H")
        return draw(st.integers(1, largest // H), label="B"), H
    return 1, 1


def carry_splits(T: int, marks: tuple[int, ...]) -> st.SearchStrategy[int]:
    """Where a state-carry check cuts a sequence of ``T >= 2`` tokens: anywhere, or at and
    beside multiples of ``marks`` (chunk boundaries: a kernel's carried state is wrong on or
    just off them)."""
    if T < 2:
        return st.just(1)

    @st.composite
    def near(draw: st.DrawFn) -> int:
        return _near_marks(draw, marks, 1, T - 1, "split")

    return st.one_of(st.integers(1, T - 1), near())


@st.composite
def conformance_cases(
    draw: st.DrawFn,
    config: VLAConfig | None = None,
    sizes: ConformanceSizes | None = None,
) -> Case:
    """What :func:`vla_verify.validate` draws by default: sizes that reach a kernel's structure
    (tiling widths 16…128 and ragged widths beside them, lengths across several chunks of 64
    and 128, ``B·H`` up to 6 with ``B > 2`` or ``H > 2``, ``dk != dv`` two times in three),
    mostly small so that a failure shrinks to a small example, and the regimes of :func:`cases`.
    With ``sizes.head_dims`` the widths come from those alone.
    """
    config = VLAConfig() if config is None else config
    sizes = ConformanceSizes() if sizes is None else sizes
    B, H = _batch_heads(draw, sizes.max_batch)
    widths = sizes.head_dims
    dk = draw(st.sampled_from(widths), label="dk") if widths else _width(draw, sizes.max_dk, "dk")
    same = _weighted(draw, [("independent", 2), ("same", 1)], "dv_kind") == "same"
    if widths:
        dv = dk if same else draw(st.sampled_from(widths), label="dv")
    else:
        max_dv = sizes.max_dk if sizes.max_dv is None else sizes.max_dv
        dv = min(dk, max_dv) if same else _width(draw, max_dv, "dv")
    T = _length(draw, sizes)
    # The cost cap shortens only the widest, most batched examples, and keeps two chunks.
    floor_T = 2 * (sizes.chunk_size or max(CHUNK_MARKS)) + 2
    cap = max(floor_T, sizes.max_work // (B * H * dk * max(dk, dv)))
    T = min(T, cap, sizes.max_T)
    return _draw_values(
        draw,
        config,
        (B, T, H, dk, dv),
        carry_splits(T, sizes.marks),
        key_regimes=KEY_REGIMES,
        penalty_regimes=PENALTY_REGIMES,
        query_regimes=QUERY_REGIMES,
        value_regimes=VALUE_REGIMES,
        state_regimes=STATE_REGIMES,
    )


#: Values the configuration sweep draws (spec §2.2), the paper preset's first.
SWEEP_LAMBDA0 = (0.1, 1e-3, 1e-2, 1.0, 10.0, 100.0)
SWEEP_NUDGE_PERIODS: tuple[int | None, ...] = (20, None, 1, 3, 7, 48, 96)
SWEEP_NUDGE_ETA = (1e-3, 0.0, 1e-1)
SWEEP_SM_FLOOR = (1e-4, 1e-12, 0.5, 4.0)
SWEEP_OUT_EPS = (1e-4, 1e-12, 1.0)


@st.composite
def swept_configs(draw: st.DrawFn, given: VLAConfig, variant: str = "vla") -> VLAConfig:
    """The configuration ``given`` or, two times in three, one drawn across spec §2.2: ``λ0``
    over decades, nudge periods 1, 3, 7 and ones that do not divide a chunk of 64 (48, 96),
    no nudges, nudge sizes 0…0.1, both normalisations, tiny and large floors
    (``sm_floor`` up to 4, above the ``δ = 1 + uᵀAu >= 1`` of an SPD chain, so that it acts;
    ``out_eps``).  A kernel that ignores a field of :class:`VLAConfig` is then
    compared with the oracle under a value it does not use.  ``variant="rls"`` keeps no nudges.
    """
    if _weighted(draw, [("given", 1), ("swept", 2)], "config_kind") == "given":
        return given
    period = draw(st.sampled_from(SWEEP_NUDGE_PERIODS), label="nudge_period")
    return VLAConfig(
        lambda0=draw(st.sampled_from(SWEEP_LAMBDA0), label="lambda0"),
        sm_floor=draw(st.sampled_from(SWEEP_SM_FLOOR), label="sm_floor"),
        nudge_eta=draw(st.sampled_from(SWEEP_NUDGE_ETA), label="nudge_eta"),
        nudge_period=None if variant == "rls" else period,
        normalize_gate=draw(st.sampled_from((True, False)), label="normalize_gate"),
        normalize_output=draw(st.sampled_from((True, False)), label="normalize_output"),
        out_eps=draw(st.sampled_from(SWEEP_OUT_EPS), label="out_eps"),
        norm_eps=given.norm_eps,
    )


# -- composable presets ----------------------------------------------------------------------


def hard_cases(config: VLAConfig | None = None, bounds: ShapeBounds | None = None) -> Any:
    """:func:`cases` over every further corner: ill-conditioned penalties (κ to 1e8), keys at
    angles down to 1e-3, positive-orthant keys, cancelling read-out denominators, bounded and
    large values, given initial states (SPD and indefinite)."""
    return cases(
        config,
        bounds,
        key_regimes=ALL_KEY_REGIMES,
        penalty_regimes=ALL_PENALTY_REGIMES,
        query_regimes=ALL_QUERY_REGIMES,
        value_regimes=ALL_VALUE_REGIMES,
        state_regimes=STATE_REGIMES,
    )


def bounded_cases(config: VLAConfig | None = None, bounds: ShapeBounds | None = None) -> Any:
    """Inputs satisfying the hypotheses of claim C5 (spec §3): unit keys ``k_t`` (so ``k̂ = k``),
    ``||v_t|| <= 1``, no initial state; penalties from every regime."""
    return cases(
        config,
        bounds,
        key_regimes=("unit", "near_parallel_tight"),
        penalty_regimes=ALL_PENALTY_REGIMES,
        query_regimes=("positive",),
        value_regimes=("bounded", "unit"),
        state_regimes=("none",),
    )


def long_cases(
    config: VLAConfig | None = None,
    *,
    min_T: int = 256,
    max_T: int = 2048,
    max_dk: int = 4,
    max_dv: int = 4,
    **regimes: tuple[str, ...],
) -> Any:
    """Long sequences (``min_T <= T <= max_T``, B = H = 1, narrow heads so they stay fast) — the
    regime where growth (claims C4, C5) and drift (C1 in float32) show.  ``regimes`` pass on to
    :func:`cases` (``key_regimes=...``)."""
    bounds = ShapeBounds(max_B=1, max_H=1, min_T=min_T, max_T=max_T, max_dk=max_dk, max_dv=max_dv)
    return cases(config, bounds, **regimes)


#: Regime sets per claim of spec §3 (what the claim's hypotheses allow), for :func:`claim_cases`.
CLAIM_REGIMES: dict[str, dict[str, tuple[str, ...]]] = {
    # C1/C2: the penalty chain from A_0 = I/lambda0 or an SPD state (indefinite states void SM).
    "C1": {"penalty_regimes": ALL_PENALTY_REGIMES, "state_regimes": ("none", "spd")},
    "C2": {"penalty_regimes": ALL_PENALTY_REGIMES, "state_regimes": ("none", "spd")},
    # C3: S_0 = 0, A_0 = I/lambda0 (the objective has no prior term).
    "C3": {
        "key_regimes": ALL_KEY_REGIMES,
        "penalty_regimes": ALL_PENALTY_REGIMES,
        "value_regimes": ALL_VALUE_REGIMES,
        "state_regimes": ("none",),
    },
    "C4": {
        "key_regimes": ALL_KEY_REGIMES,
        "penalty_regimes": ALL_PENALTY_REGIMES,
        "state_regimes": ("none", "spd"),
    },
    "C5": {
        "key_regimes": ("unit", "near_parallel_tight"),
        "penalty_regimes": ALL_PENALTY_REGIMES,
        "query_regimes": ("positive",),
        "value_regimes": ("bounded", "unit"),
        "state_regimes": ("none",),
    },
}


def claim_cases(
    claim: str, config: VLAConfig | None = None, bounds: ShapeBounds | None = None
) -> Any:
    """:func:`cases` restricted to the hypotheses of ``claim`` (``"C1"`` … ``"C5"``, spec §3);
    any other claim gets :func:`hard_cases`."""
    if claim not in CLAIM_REGIMES:
        return hard_cases(config, bounds)
    return cases(config, bounds, **CLAIM_REGIMES[claim])


@st.composite
def initial_states(
    draw: st.DrawFn,
    B: int,
    H: int,
    dk: int,
    dv: int,
    *,
    lambda0: float = 0.1,
    regimes: tuple[str, ...] = ("spd", "indefinite"),
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A given initial state ``(S [B,H,dv,dk], A [B,H,dk,dk], z [B,H,dk])`` (spec §2.3): ``spd``
    (``A = (lambda0·I + G Gᵀ)^{-1}``) or ``indefinite`` (symmetric ``A`` with negative
    eigenvalues, which drives the Sherman–Morrison denominator to its floor)."""
    regime = draw(st.sampled_from(regimes), label="state_regime")
    seed = draw(st.integers(0, 2**32 - 1), label="state_seed")
    state = make_state(np.random.default_rng(seed), regime, B, H, dk, dv, lambda0)
    assert state is not None
    return state


#: Large finite stand-in for an infinite observation (``hypothesis.target`` needs finite floats).
TARGET_CAP = 1e300


def safe_target(observation: float, label: str, *, log10: bool = False) -> float:
    """``hypothesis.target(observation, label=label)`` made safe for any float: NaN is skipped,
    ±inf is capped at ±:data:`TARGET_CAP`; ``log10=True`` targets ``log10(observation)`` (for
    growth that spans many decades; ``observation <= 0`` becomes -400).  Returns what was sent.

    Use it wherever a claim bounds something (a norm, a growth rate, an error), so Hypothesis
    searches for the largest value instead of sampling blindly.
    """
    from hypothesis import target

    x = float(observation)
    if log10:
        x = float(np.log10(x)) if x > 0 else -400.0
    if np.isnan(x):
        return x
    x = float(np.clip(x, -TARGET_CAP, TARGET_CAP))
    target(x, label=label)
    return x
