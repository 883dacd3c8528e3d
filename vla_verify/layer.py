"""The attention layer of spec §2.5 in NumPy, forward only, with random weights (claim C6).

Per head, from the (pre-LayerNorm'd) input ``x_t``::

    k_raw = W_k x,   k = φ(k_raw),   q = φ(W_q x),   v = W_v x,
    u = normalize(W_u k_raw) / sqrt(d_h)              (W_u bias-free, spec §2.1 and §2.5)

with ``φ(x) = ELU(x) + 1``; the heads run the mixer (the oracle's :func:`~vla_verify.oracle.
recurrence` for ``vla``, ``rls``, ``delta`` and ``linear``, or causal softmax attention), are
concatenated, LayerNorm'd and projected by ``W_o``.

Weights follow PyTorch's defaults, so that "random weights" means what it means in the authors'
code: ``nn.Linear`` draws ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))`` and ``nn.Embedding`` draws
``N(0, 1)``.  Tokens are embedded and passed through the block's pre-LayerNorm before the
projections (the backbone of spec §2.5 is pre-LN).

The trainable counterpart is :class:`vla_verify.experiments.model.AttentionLayer` (PyTorch, any
registered differentiable backend); its ``from_weights`` loads these weights and reproduces
:func:`layer_forward`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .errors import ConfigError, ShapeError, UnknownVariantError
from .oracle import recurrence
from .spec import VLAConfig

__all__ = [
    "MIXERS",
    "LayerOutput",
    "LayerWeights",
    "elu_plus_one",
    "init_layer",
    "layer_forward",
    "layer_inputs",
    "layer_norm",
]

#: Mixers the layer can run: the recurrences of spec §2.3–§2.4 and causal softmax attention.
MIXERS: tuple[str, ...] = ("vla", "rls", "delta", "linear", "softmax")


def elu_plus_one(x: np.ndarray) -> np.ndarray:
    """``φ(x) = ELU(x) + 1`` (spec §2.1): ``x + 1`` for ``x > 0``, ``exp(x)`` otherwise."""
    x = np.asarray(x, dtype=np.float64)
    return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))


def layer_norm(x: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    """LayerNorm over the last axis with unit gain and zero bias (PyTorch's initial values)."""
    mean = x.mean(axis=-1, keepdims=True)
    var = x.var(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps)


@dataclass(frozen=True)
class LayerWeights:
    """Weights of one layer: per-head projections ``[H, d_h, d_model]``, ``W_o`` and the
    token embedding ``[vocab, d_model]``."""

    embedding: np.ndarray
    W_q: np.ndarray
    W_k: np.ndarray
    W_v: np.ndarray
    W_u: np.ndarray
    W_o: np.ndarray

    @property
    def n_heads(self) -> int:
        return int(self.W_q.shape[0])

    @property
    def d_head(self) -> int:
        return int(self.W_q.shape[1])

    @property
    def d_model(self) -> int:
        return int(self.W_q.shape[2])

    @property
    def vocab(self) -> int:
        return int(self.embedding.shape[0])


def init_layer(
    d_model: int = 128, n_heads: int = 4, vocab: int = 128, *, seed: int = 0
) -> LayerWeights:
    """Random weights with PyTorch's default initialisation (module docstring).

    The defaults are the authors' backbone of spec §2.5: ``d_model`` 128, 4 heads (``d_h`` 32),
    vocabulary 128.
    """
    for name, value in (("d_model", d_model), ("n_heads", n_heads), ("vocab", vocab)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ConfigError(name, f"expected a positive integer, got {value!r}")
    if d_model % n_heads:
        raise ConfigError("n_heads", f"expected a divisor of d_model={d_model}, got {n_heads}")
    d_h = d_model // n_heads
    rng = np.random.default_rng(seed)
    bound = 1.0 / np.sqrt(d_model)

    def linear(*shape: int) -> np.ndarray:
        return rng.uniform(-bound, bound, size=shape)

    return LayerWeights(
        embedding=rng.standard_normal((vocab, d_model)),
        W_q=linear(n_heads, d_h, d_model),
        W_k=linear(n_heads, d_h, d_model),
        W_v=linear(n_heads, d_h, d_model),
        W_u=rng.uniform(-1 / np.sqrt(d_h), 1 / np.sqrt(d_h), size=(n_heads, d_h, d_h)),
        W_o=linear(d_model, d_model),
    )


def _check_tokens(weights: LayerWeights, tokens: np.ndarray) -> np.ndarray:
    tokens = np.asarray(tokens)
    if tokens.ndim == 1:
        tokens = tokens[None]
    if tokens.ndim != 2 or tokens.shape[1] < 1:
        raise ShapeError("tokens", f"expected shape [T] or [B, T] with T >= 1, got {tokens.shape}")
    if not np.issubdtype(tokens.dtype, np.integer):
        raise ShapeError("tokens", f"expected integer token ids, got dtype {tokens.dtype}")
    if tokens.min() < 0 or tokens.max() >= weights.vocab:
        raise ShapeError("tokens", f"expected ids in [0, {weights.vocab}), got {tokens.min()}…")
    return tokens


def layer_inputs(
    weights: LayerWeights, tokens: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The mixer's inputs ``(q, k, v, u)``, each ``[B, T, H, d_h]`` float64 (spec §2.5)."""
    tokens = _check_tokens(weights, tokens)
    x = layer_norm(weights.embedding[tokens])  # [B, T, d_model], the block's pre-LN
    k_raw = np.einsum("hjd,btd->bthj", weights.W_k, x)
    q = elu_plus_one(np.einsum("hjd,btd->bthj", weights.W_q, x))
    k = elu_plus_one(k_raw)
    v = np.einsum("hjd,btd->bthj", weights.W_v, x)
    projected = np.einsum("hij,bthj->bthi", weights.W_u, k_raw)
    norm = np.maximum(np.linalg.norm(projected, axis=-1, keepdims=True), 1e-12)
    u = projected / norm / np.sqrt(weights.d_head)
    return q, k, v, u


class LayerOutput(NamedTuple):
    """``y`` ``[B, T, d_model]``; ``state_norms`` ``||S_t||_F`` per head ``[B, T, H]`` (NaN for
    softmax, which keeps no state); ``final_state`` ``S_T`` ``[B, H, d_h, d_h]`` or None."""

    y: np.ndarray
    state_norms: np.ndarray
    final_state: np.ndarray | None


def _softmax_mixer(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    _B, T, _H, d = q.shape
    scores = np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(d)
    mask = np.tril(np.ones((T, T), dtype=bool))
    scores = np.where(mask, scores, -np.inf)
    scores -= scores.max(axis=-1, keepdims=True)
    w = np.exp(scores)
    w /= w.sum(axis=-1, keepdims=True)
    return np.einsum("bhts,bshd->bthd", w, v)


def layer_forward(
    weights: LayerWeights,
    tokens: np.ndarray,
    *,
    mixer: str = "vla",
    config: VLAConfig | None = None,
) -> LayerOutput:
    """Run the layer of spec §2.5 on ``tokens`` (``[T]`` or ``[B, T]`` integer ids).

    ``mixer`` is one of :data:`MIXERS`; ``config`` (default the paper preset; ``rls`` needs
    :meth:`VLAConfig.exact`) is passed to the oracle recurrence.
    """
    if mixer not in MIXERS:
        raise UnknownVariantError("mixer", f"expected one of {MIXERS}, got {mixer!r}")
    q, k, v, u = layer_inputs(weights, tokens)
    B, T, H, d = q.shape
    if mixer == "softmax":
        heads = _softmax_mixer(q, k, v)
        norms = np.full((B, T, H), np.nan)
        final = None
    else:
        config = VLAConfig() if config is None else config
        result = recurrence(q, k, v, u, config=config, variant=mixer, return_states=True)
        heads = result.o
        assert result.history is not None
        norms = np.linalg.norm(result.history.S, axis=(-2, -1))
        final = result.state[0]
    y = layer_norm(heads.reshape(B, T, H * d)) @ weights.W_o.T
    return LayerOutput(y, norms, final)
