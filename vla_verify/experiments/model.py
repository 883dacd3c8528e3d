"""The attention layer and 2-layer backbone of spec §2.5 as PyTorch modules (imports torch).

:class:`AttentionLayer` is the layer of :mod:`vla_verify.layer` (the NumPy forward with random
weights) made trainable: per head, from the block's pre-LayerNorm'd input ``x`` ``[B, T, d_model]``
(float32 or float64)::

    k_raw = W_k x,  k = φ(k_raw),  q = φ(W_q x),  v = W_v x,  u = normalize(W_u k_raw)/sqrt(d_h)

(``φ = ELU + 1``), the heads run the mixer on ``[B, T, H, d_h]`` tensors, are concatenated,
LayerNorm'd and projected by ``W_o``.  :meth:`AttentionLayer.from_weights` loads a
:class:`~vla_verify.layer.LayerWeights`, so the module reproduces
:func:`~vla_verify.layer.layer_forward` exactly (``tests/test_layer.py``).

Mixers (:data:`MIXERS`):

- ``vla`` — spec §2.3 through a registered differentiable backend (``torch``, the sequential
  recurrence, on the CPU; ``triton_fused`` on CUDA);
- ``linear`` — spec §2.4 linear attention through ``torch_chunked``;
- ``delta`` — spec §2.4 ``delta`` (β = 1, φ features, the z read-out) through ``torch_chunked``;
- ``deltanet`` — DeltaNet: ``q``, ``k`` L2-normalised projections (no φ),
  ``β_t = sigmoid(W_β x_t)`` per head, ``S_t = S_{t-1} + β_t (v_t − S_{t-1} k_t) k_tᵀ``,
  ``o_t = S_t q_t`` (no z read-out).  The repository's ``delta`` variant has β = 1 only, so the
  β-gated rule is written here (:func:`gated_delta_rule`); on CUDA, when flash-linear-attention
  is installed, its ``fused_recurrent_delta_rule`` kernel computes the same thing (``scale=1``)
  in float32, as the other mixers train (fla's ``chunk_delta_rule`` refuses float32).  With
  ``short_conv=4`` (below) it is the standard DeltaNet layer's mixing;
- ``softmax`` — causal scaled-dot-product attention on the raw projections ``W_q x``, ``W_k x``
  (the standard transformer; φ would only restrict its scores).

``ModelConfig.short_conv`` = w > 0 passes each of the three projections ``W_q x``, ``W_k x``,
``W_v x`` through its own depthwise causal convolution of width w followed by SiLU
(:class:`ShortConvolution`) before anything else reads them — the short convolution of the
standard DeltaNet layer (width 4 there), absent from the spec §2.5 backbone.  It lets a token's
key see the tokens just before it, which associative recall needs (a value follows its key).

Heads are ``d_h = d_model / n_heads`` wide.  Every module is plain ``nn.Module``; the backend
is looked up once per layer with :func:`vla_verify.backends.get`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from .. import backends
from ..errors import ConfigError, UnknownVariantError
from ..layer import LayerWeights
from ..spec import VLAConfig

__all__ = [
    "MIXERS",
    "PENALTY_MIXERS",
    "RECURRENT_MIXERS",
    "AttentionLayer",
    "Backbone",
    "ModelConfig",
    "ShortConvolution",
    "default_backend",
    "gated_delta_rule",
    "head_inputs",
]

#: The mixers an :class:`AttentionLayer` runs.
MIXERS: tuple[str, ...] = ("vla", "linear", "delta", "deltanet", "softmax")
#: Mixers run by a registry backend on the inputs ``q, k, v, u`` of spec §2.1.
PENALTY_MIXERS: tuple[str, ...] = ("vla", "linear", "delta")
#: Mixers that keep a state ``S_t`` (the state-norm probe's subjects).
RECURRENT_MIXERS: tuple[str, ...] = ("vla", "linear", "delta", "deltanet")


@dataclass(frozen=True)
class ModelConfig:
    """The backbone of spec §2.5; the defaults are the authors' (2 pre-LN blocks, ``d_model``
    128, 4 heads, FFN 256, vocabulary 128, tied embeddings).

    ``backend``: the registry name for ``vla``/``linear``/``delta`` (None: :func:`default_backend`).
    ``vla_config``: the recurrence's configuration as :class:`VLAConfig` fields (default the paper
    preset).  ``positions``: add learned absolute position embeddings (the spec's backbone has
    none; off by default).  ``embedding_std``: initialise the token (and position) embeddings
    from ``N(0, embedding_std²)``; ``None`` keeps PyTorch's ``N(0, 1)``, under which the tied
    output projection starts with logits of standard deviation about ``√d_model`` (an initial
    loss near 100 nats at ``d_model`` 128 where ``ln vocab`` is 4.9).  GPT-2's 0.02 starts
    every model near ``ln vocab``.
    """

    mixer: str = "vla"
    vocab: int = 128
    d_model: int = 128
    n_heads: int = 4
    d_ffn: int = 256
    n_layers: int = 2
    backend: str | None = None
    vla_config: dict[str, Any] = field(default_factory=dict)
    positions: bool = False
    max_len: int = 2048
    embedding_std: float | None = None
    short_conv: int = 0

    def __post_init__(self) -> None:
        if self.mixer not in MIXERS:
            raise UnknownVariantError("mixer", f"expected one of {MIXERS}, got {self.mixer!r}")
        for name in ("vocab", "d_model", "n_heads", "d_ffn", "n_layers", "max_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(name, f"expected a positive integer, got {value!r}")
        if (
            isinstance(self.short_conv, bool)
            or not isinstance(self.short_conv, int)
            or self.short_conv < 0
        ):
            raise ConfigError(
                "short_conv", f"expected a convolution width >= 0, got {self.short_conv!r}"
            )
        if self.d_model % self.n_heads:
            raise ConfigError(
                "n_heads", f"expected a divisor of d_model={self.d_model}, got {self.n_heads}"
            )
        if self.embedding_std is not None and (
            isinstance(self.embedding_std, bool) or not self.embedding_std > 0
        ):
            raise ConfigError(
                "embedding_std", f"expected a positive float or None, got {self.embedding_std!r}"
            )
        VLAConfig(**self.vla_config)  # a bad field fails here, naming itself

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def default_backend(mixer: str, device: str) -> str:
    """The registry backend a mixer runs on by default on ``device`` (``"cpu"``/``"cuda"``)."""
    if mixer == "vla":
        return "triton_fused" if device == "cuda" else "torch"
    return "torch_chunked"


def elu_plus_one(x: torch.Tensor) -> torch.Tensor:
    """``φ(x) = ELU(x) + 1`` (spec §2.1)."""
    return F.elu(x) + 1.0


def gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The β-gated delta rule, token by token: ``S_t = S_{t-1} + β_t (v_t − S_{t-1} k_t) k_tᵀ``,
    ``o_t = S_t q_t``.

    ``q``, ``k`` ``[B, T, H, dk]`` (already normalised by the caller), ``v`` ``[B, T, H, dv]``,
    ``beta`` ``[B, T, H]``; ``initial_state`` ``S_0`` ``[B, H, dv, dk]`` (default 0).  Returns
    ``o`` ``[B, T, H, dv]`` and ``S_T``, in the inputs' dtype; differentiable.
    """
    B, T, H, dk = q.shape
    dv = v.shape[-1]
    S = q.new_zeros(B, H, dv, dk) if initial_state is None else initial_state
    outputs = []
    for t in range(T):
        k_t = k[:, t]
        residual = v[:, t] - (S @ k_t.unsqueeze(-1)).squeeze(-1)
        S = S + (beta[:, t, :, None] * residual).unsqueeze(-1) * k_t.unsqueeze(-2)
        outputs.append((S @ q[:, t].unsqueeze(-1)).squeeze(-1))
    return torch.stack(outputs, dim=1), S


def head_inputs(
    mixer: str,
    q_raw: torch.Tensor,
    k_raw: torch.Tensor,
    v: torch.Tensor,
    *,
    penalty: torch.Tensor | None = None,
    beta_logit: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """The mixer's per-head inputs (module docstring) from the projections ``q_raw``, ``k_raw``,
    ``v`` ``[B, T, H, d_h]``: ``penalty`` is ``W_u k_raw`` ``[B, T, H, d_h]`` for the
    :data:`PENALTY_MIXERS`, ``beta_logit`` is ``W_β x`` ``[B, T, H]`` for ``deltanet``."""
    if mixer == "softmax":
        return {"q": q_raw, "k": k_raw, "v": v}
    if mixer == "deltanet":
        if beta_logit is None:
            raise ConfigError("beta_logit", "expected W_β x for the deltanet mixer")
        return {
            "q": F.normalize(q_raw, dim=-1),
            "k": F.normalize(k_raw, dim=-1),
            "v": v,
            "beta": torch.sigmoid(beta_logit),
        }
    if penalty is None:
        raise ConfigError("penalty", f"expected W_u k_raw for the {mixer} mixer")
    u = F.normalize(penalty, dim=-1, eps=1e-12) / math.sqrt(q_raw.shape[-1])
    return {"q": elu_plus_one(q_raw), "k": elu_plus_one(k_raw), "v": v, "u": u}


class ShortConvolution(nn.Module):
    """A depthwise causal convolution of width ``width`` over time, then SiLU: ``[B, T, C] ->
    [B, T, C]``, output ``t`` reading inputs ``t − width + 1 … t`` (zeros before the start)."""

    def __init__(self, channels: int, width: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(
            channels, channels, width, groups=channels, padding=width - 1, bias=False
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Padding both ends by width − 1 and keeping the first T outputs makes it causal.
        y = self.conv(x.transpose(1, 2))[..., : x.shape[1]]
        return F.silu(y).transpose(1, 2)


def _fla_delta_rule() -> Any:
    """fla's ``fused_recurrent_delta_rule`` (float32 in and out, forward and backward), or None
    when flash-linear-attention is not installed."""
    try:
        from fla.ops.delta_rule import fused_recurrent_delta_rule
    except ImportError:
        return None
    return fused_recurrent_delta_rule


class AttentionLayer(nn.Module):
    """The layer of spec §2.5 (module docstring): ``forward(x [B, T, d_model]) -> [B, T,
    d_model]``.  :meth:`mixer_inputs` returns the heads' inputs for the state-norm probe."""

    def __init__(self, config: ModelConfig, device: str = "cpu") -> None:
        super().__init__()
        self.config = config
        self.mixer = config.mixer
        H, d, D = config.n_heads, config.d_head, config.d_model
        self.W_q = nn.Linear(D, H * d, bias=False)
        self.W_k = nn.Linear(D, H * d, bias=False)
        self.W_v = nn.Linear(D, H * d, bias=False)
        self.W_o = nn.Linear(H * d, D, bias=False)
        self.norm = nn.LayerNorm(H * d)
        # W_u acts on one head's k_raw (spec §2.5: a bias-free d_h × d_h map per head).
        bound = 1.0 / math.sqrt(d)
        self.W_u = nn.Parameter(torch.empty(H, d, d).uniform_(-bound, bound))
        self.W_beta = nn.Linear(D, H) if config.mixer == "deltanet" else None
        self.convs = (
            nn.ModuleList(ShortConvolution(H * d, config.short_conv) for _ in range(3))
            if config.short_conv
            else None
        )
        self.vla_config = VLAConfig(**config.vla_config)
        self._fla = None
        self._backend = None
        if config.mixer in PENALTY_MIXERS:
            name = config.backend or default_backend(config.mixer, device)
            backend = backends.get(name, variant=config.mixer)
            if device == "cuda" and "check_finite" in backend.capabilities.options:
                # The input check reads the inputs back: a device sync per mixer call, which
                # stalls a training step that the host queues ahead of the GPU.  Training
                # watches its losses and gradient norms for non-finite values instead.
                backend = backend.bind(check_finite=False)
            self._backend = backend
            if config.mixer != "vla":  # linear and delta keep no A: nudges change nothing
                self.vla_config = VLAConfig.exact(
                    out_eps=self.vla_config.out_eps, norm_eps=self.vla_config.norm_eps
                )
        elif config.mixer == "deltanet" and device == "cuda" and config.backend != "torch":
            self._fla = _fla_delta_rule()

    @property
    def backend_name(self) -> str:
        """What computes the mixer (for the results' provenance)."""
        if self._backend is not None:
            return self._backend.name
        if self.mixer == "deltanet":
            return "fla.fused_recurrent_delta_rule" if self._fla is not None else "gated_delta_rule"
        return "sdpa"

    @classmethod
    def from_weights(cls, weights: LayerWeights, mixer: str, **config: Any) -> AttentionLayer:
        """A float64 layer holding the weights of :func:`vla_verify.layer.init_layer`."""
        cfg = ModelConfig(
            mixer=mixer,
            vocab=weights.vocab,
            d_model=weights.d_model,
            n_heads=weights.n_heads,
            **config,
        )
        layer = cls(cfg).double()
        with torch.no_grad():
            for name in ("W_q", "W_k", "W_v"):
                w = torch.as_tensor(getattr(weights, name))  # [H, d_h, d_model]
                getattr(layer, name).weight.copy_(w.reshape(-1, w.shape[-1]))
            layer.W_o.weight.copy_(torch.as_tensor(weights.W_o))
            layer.W_u.copy_(torch.as_tensor(weights.W_u))
        return layer

    def _split(self, y: torch.Tensor) -> torch.Tensor:
        B, T, _ = y.shape
        return y.view(B, T, self.config.n_heads, self.config.d_head)

    def mixer_inputs(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """The heads' inputs, each ``[B, T, H, d_h]`` (``beta`` ``[B, T, H]`` for deltanet)."""
        projections = [W(x) for W in (self.W_q, self.W_k, self.W_v)]
        if self.convs is not None:
            projections = [conv(y) for conv, y in zip(self.convs, projections, strict=True)]
        q_raw, k_raw, v = (self._split(y) for y in projections)
        penalty = beta_logit = None
        if self.W_beta is not None:
            beta_logit = self.W_beta(x)
        elif self.mixer in PENALTY_MIXERS:
            penalty = torch.einsum("hij,bthj->bthi", self.W_u, k_raw)
        return head_inputs(self.mixer, q_raw, k_raw, v, penalty=penalty, beta_logit=beta_logit)

    def run_mixer(
        self, inputs: dict[str, torch.Tensor], state: Any = None, start: int = 0
    ) -> tuple[torch.Tensor, Any]:
        """The heads' outputs ``[B, T, H, d_h]`` and the state after the last token: ``(S, A,
        z)`` for the backend mixers, ``S`` for deltanet, None for softmax.  ``state`` and
        ``start`` continue a sequence (spec §2.3)."""
        if self.mixer == "softmax":
            q, k, v = (inputs[n].transpose(1, 2) for n in ("q", "k", "v"))
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return o.transpose(1, 2), None
        if self.mixer == "deltanet":
            q, k, v, beta = inputs["q"], inputs["k"], inputs["v"], inputs["beta"]
            if self._fla is not None and state is None:
                o, _ = self._fla(q, k, v, beta, scale=1.0)
                return o, None
            return gated_delta_rule(q, k, v, beta, state)
        assert self._backend is not None
        q, k, v, u = (inputs[n] for n in ("q", "k", "v", "u"))
        return self._backend(q, k, v, u, config=self.vla_config, initial_state=state, start=start)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        heads, _ = self.run_mixer(self.mixer_inputs(x))
        B, T = x.shape[:2]
        return self.W_o(self.norm(heads.reshape(B, T, -1)))


class Block(nn.Module):
    """A pre-LN block: ``x + attn(LN(x))``, then ``x + FFN(LN(x))`` (GELU FFN)."""

    def __init__(self, config: ModelConfig, device: str = "cpu") -> None:
        super().__init__()
        self.ln_attn = nn.LayerNorm(config.d_model)
        self.attn = AttentionLayer(config, device)
        self.ln_ffn = nn.LayerNorm(config.d_model)
        self.ffn = nn.Sequential(
            nn.Linear(config.d_model, config.d_ffn),
            nn.GELU(),
            nn.Linear(config.d_ffn, config.d_model),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_attn(x))
        return x + self.ffn(self.ln_ffn(x))


class Backbone(nn.Module):
    """Token ids ``[B, T]`` (int64) -> logits ``[B, T, vocab]``: embedding, ``n_layers``
    pre-LN blocks, a final LayerNorm and the tied output projection (spec §2.5)."""

    def __init__(self, config: ModelConfig, device: str = "cpu") -> None:
        super().__init__()
        self.config = config
        self.embedding = nn.Embedding(config.vocab, config.d_model)
        self.position = nn.Embedding(config.max_len, config.d_model) if config.positions else None
        self.blocks = nn.ModuleList(Block(config, device) for _ in range(config.n_layers))
        self.ln_out = nn.LayerNorm(config.d_model)
        if config.embedding_std is not None:
            for table in (self.embedding, self.position):
                if table is not None:
                    nn.init.normal_(table.weight, std=config.embedding_std)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embedding(tokens)
        if self.position is not None:
            if tokens.shape[1] > self.config.max_len:
                raise ConfigError(
                    "max_len", f"expected sequences of at most {self.config.max_len} tokens"
                )
            x = x + self.position(torch.arange(tokens.shape[1], device=tokens.device))
        return x

    def layers(self) -> list[Block]:
        """The blocks, in order."""
        return [cast(Block, block) for block in self.blocks]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.layers():
            x = block(x)
        return self.ln_out(x) @ self.embedding.weight.T

    @property
    def backend_names(self) -> list[str]:
        return [block.attn.backend_name for block in self.layers()]
