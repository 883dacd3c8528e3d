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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import strategies as st

from ..spec import VLAConfig

__all__ = ["KEY_REGIMES", "PENALTY_REGIMES", "QUERY_REGIMES", "Case", "ShapeBounds", "cases"]

KEY_REGIMES = ("gaussian", "positive", "near_parallel", "repeated", "scaled")
PENALTY_REGIMES = ("layer", "gaussian", "concentrated", "tiny", "zero")
QUERY_REGIMES = ("positive", "signed", "tiny")
VALUE_REGIMES = ("gaussian", "large")
STATE_REGIMES = ("none", "spd", "indefinite")


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
    raise ValueError(f"unknown penalty regime {regime!r}")


def make_queries(rng: np.random.Generator, regime: str, shape: tuple[int, ...]) -> np.ndarray:
    if regime == "positive":
        return _elu_plus_one(rng.standard_normal(shape))
    if regime == "signed":
        return rng.standard_normal(shape)
    if regime == "tiny":
        return 1e-7 * _elu_plus_one(rng.standard_normal(shape))
    raise ValueError(f"unknown query regime {regime!r}")


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
    regimes = {
        "keys": draw(st.sampled_from(key_regimes), label="keys"),
        "penalties": draw(st.sampled_from(penalty_regimes), label="penalties"),
        "queries": draw(st.sampled_from(query_regimes), label="queries"),
        "values": draw(st.sampled_from(value_regimes), label="values"),
        "initial_state": draw(st.sampled_from(state_regimes), label="initial_state"),
    }
    seed = draw(st.integers(0, 2**32 - 1), label="seed")
    split = draw(st.integers(1, T - 1), label="split") if T >= 2 else 1
    rng = np.random.default_rng(seed)
    shape = (B, T, H, dk)
    k_raw = rng.standard_normal(shape)
    k = make_keys(rng, regimes["keys"], shape)
    u = make_penalties(rng, regimes["penalties"], shape, k_raw)
    q = make_queries(rng, regimes["queries"], shape)
    v = rng.standard_normal((B, T, H, dv)) * (100.0 if regimes["values"] == "large" else 1.0)
    state = make_state(rng, regimes["initial_state"], B, H, dk, dv, config.lambda0)
    return Case(q, k, v, u, state, split, regimes, seed)
