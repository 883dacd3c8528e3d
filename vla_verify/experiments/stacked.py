"""Several backbones of one configuration trained side by side in one set of kernels (imports
torch).

A grid's jobs are small: one backbone of spec §2.5 at ``B`` = 64, ``T`` = 256 launches a few
hundred kernels per training step, each too small to fill a GPU, and the recurrent mixers'
kernels are sequential in ``T``, so their time hardly depends on how many sequences they carry.
Processes sharing a GPU do not help much: their kernels take turns on the device instead of
running together.  :class:`StackedBackbone` holds the parameters of ``M`` backbones stacked
along a leading axis and runs them as one model: every matrix product is a batched product over
the members, and the mixers — which hold no parameters — see the members' sequences as one batch
of ``M·B``.  So ``M`` jobs cost about the kernels of one.

Nothing couples the members: each has its own parameters, data and loss, and the optimiser
(:class:`StackedAdamW`) and the gradient clipping (:func:`clip_grad_norms`) act per member, so a
member trains as it would alone (``tests/test_experiments_stacked.py`` checks logits, losses and
weights against single backbones in float64).

Layout: ``tokens`` ``[M, B, T]`` int64 -> logits ``[M, B, T, vocab]``; the parameter of a
backbone named ``name`` ``[*shape]`` is :meth:`StackedBackbone.param` ``(name)`` ``[M, *shape]``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from .model import PENALTY_MIXERS, AttentionLayer, Backbone, head_inputs

__all__ = ["StackedAdamW", "StackedBackbone", "clip_grad_norms"]

_SEP = "/"  # parameter names hold "." (module paths); a ParameterDict key may not
#: Rows per slice of a weight gradient's reduction (:func:`_weight_gradient`).
_ROWS_PER_SLICE = 2048


def _weight_gradient(dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``dyᵀ x`` per member: ``dy`` ``[M, N, out]``, ``x`` ``[M, N, in]`` -> ``[M, out, in]``.

    A weight's gradient reduces over all ``N = B·T`` tokens into a small ``out × in`` matrix:
    one batched product of ``M`` such matrices has too few output tiles to occupy a GPU while
    each tile walks the whole of ``N`` (measured on the H200 at ``T`` = 1024: the weight
    gradients took over a third of a training step; ``benchmarks/results/h200/
    training_step.json``).  The reduction is cut into slices of about
    :data:`_ROWS_PER_SLICE` rows, reduced as ``M·S`` products side by side, then summed."""
    M, N, out = dy.shape
    slices = 1
    while slices * 2 * _ROWS_PER_SLICE <= N and N % (slices * 2) == 0:
        slices *= 2
    rows = N // slices
    partial = torch.bmm(
        dy.reshape(M * slices, rows, out).transpose(1, 2), x.reshape(M * slices, rows, -1)
    )
    return partial.view(M, slices, out, -1).sum(1)


class _StackedProduct(torch.autograd.Function):
    """``x @ weightᵀ`` per member: ``x`` ``[M, N, in]``, ``weight`` ``[M, out, in]`` ->
    ``[M, N, out]`` (``torch.bmm``), with the weight's gradient by :func:`_weight_gradient`."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        return torch.bmm(x, weight.transpose(1, 2))

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        x, weight = ctx.saved_tensors
        dy = dy.contiguous()
        dx = torch.bmm(dy, weight) if ctx.needs_input_grad[0] else None
        dw = _weight_gradient(dy, x.contiguous()) if ctx.needs_input_grad[1] else None
        return dx, dw


def _stacked_product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return cast(torch.Tensor, _StackedProduct.apply(x, weight))


class StackedBackbone(nn.Module):
    """``M`` :class:`~.model.Backbone` s of one :class:`~.model.ModelConfig` as one module
    (module docstring).  Built from the members (their parameters are copied, stacked), and
    written back into them by :meth:`write_back`."""

    def __init__(self, members: Sequence[Backbone]) -> None:
        super().__init__()
        if not members:
            raise ConfigError("members", "expected at least one backbone")
        config = members[0].config
        for member in members[1:]:
            if member.config != config:
                raise ConfigError(
                    "members", f"expected one configuration, got {config} and {member.config}"
                )
        self.config = config
        self.members = M = len(members)
        named = [dict(member.named_parameters()) for member in members]
        self.names = list(named[0])
        first = named[0][self.names[0]]
        sizes = [named[0][name].numel() for name in self.names]
        # Every member's parameters in one row of ``flat`` [M, P] and their gradients in one row
        # of ``flat_grad``: the optimiser and the clipping then act on two tensors, a few
        # kernels a step, instead of a few per parameter.  The parameters are views of ``flat``
        # and their ``.grad`` views of ``flat_grad``, into which backward accumulates in place.
        self.flat = torch.cat(
            [torch.stack([p[name].detach().reshape(-1) for p in named]) for name in self.names],
            dim=1,
        ).to(first.dtype)
        self.flat_grad = torch.zeros_like(self.flat)
        #: Which entries of a row weight decay acts on: the matrices, except those the
        #: configuration never reads (``W_u`` outside the penalty mixers), which get no gradient
        #: and which ``torch.optim.AdamW`` therefore leaves as they are.
        unread = config.mixer not in PENALTY_MIXERS
        self.matrix_mask = torch.cat(
            [
                torch.full(
                    (size,),
                    float(named[0][name].ndim >= 2 and not (unread and name.endswith(".W_u"))),
                    dtype=first.dtype,
                )
                for name, size in zip(self.names, sizes, strict=True)
            ]
        ).to(first.device)
        params = {}
        offset = 0
        for name, size in zip(self.names, sizes, strict=True):
            shape = (M, *named[0][name].shape)
            param = nn.Parameter(self.flat[:, offset : offset + size].view(shape))
            param.grad = self.flat_grad[:, offset : offset + size].view(shape)
            params[name.replace(".", _SEP)] = param
            offset += size
        self.stacked = nn.ParameterDict(params)
        # The mixers hold no parameters; the first member's layers run them (a plain list,
        # so that their parameters stay out of this module's).
        self._mixers: list[AttentionLayer] = [block.attn for block in members[0].layers()]

    def param(self, name: str) -> torch.Tensor:
        """The members' parameter ``name`` (a backbone's parameter name), ``[M, *shape]``."""
        return self.stacked[name.replace(".", _SEP)]

    def _apply(self, fn: Any, recurse: bool = True) -> StackedBackbone:
        # Moving or casting would give each parameter its own storage, apart from ``flat``:
        # a stack is built where it trains (from members already there).
        raise ConfigError("StackedBackbone", "build the stack from members on the device")

    @torch.no_grad()
    def write_back(self, members: Sequence[Backbone]) -> None:
        """Copy each member's parameters into ``members`` (the backbones it was built from)."""
        if len(members) != self.members:
            raise ConfigError("members", f"expected {self.members} backbones, got {len(members)}")
        for m, member in enumerate(members):
            for name, p in member.named_parameters():
                p.copy_(self.param(name)[m])

    # -- the forward pass, layer by layer as model.Backbone computes it --------------------------

    def _linear(self, x: torch.Tensor, name: str, bias: bool = False) -> torch.Tensor:
        """``x`` ``[M, B, T, in]`` through each member's ``nn.Linear`` ``name``."""
        M, B, T, _ = x.shape
        y = _stacked_product(x.reshape(M, B * T, -1), self.param(f"{name}.weight"))
        if bias:
            y = y + self.param(f"{name}.bias").unsqueeze(1)
        return y.view(M, B, T, -1)

    def _layer_norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        weight = self.param(f"{name}.weight")[:, None, None]  # [M, 1, 1, D]
        bias = self.param(f"{name}.bias")[:, None, None]
        return F.layer_norm(x, x.shape[-1:]) * weight + bias

    def _short_conv(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """:class:`~.model.ShortConvolution` of every member: one depthwise convolution over the
        members' channels side by side (``[B, M·C, T]``), as each member's ``nn.Conv1d``."""
        M, B, T, C = x.shape
        weight = self.param(f"{name}.conv.weight")  # [M, C, 1, w]
        width = weight.shape[-1]
        channels = x.permute(1, 0, 3, 2).reshape(B, M * C, T)
        y = F.conv1d(channels, weight.reshape(M * C, 1, width), padding=width - 1, groups=M * C)[
            ..., :T
        ]  # both ends padded by w − 1, the first T outputs kept: causal
        return F.silu(y.reshape(B, M, C, T).permute(1, 0, 3, 2))

    def _attention(self, i: int, x: torch.Tensor) -> torch.Tensor:
        M, B, T, _ = x.shape
        H, d = self.config.n_heads, self.config.d_head
        pre = f"blocks.{i}.attn"
        projections = [self._linear(x, f"{pre}.W_{n}") for n in "qkv"]
        if self.config.short_conv:
            projections = [
                self._short_conv(y, f"{pre}.convs.{j}") for j, y in enumerate(projections)
            ]
        q_raw, k_raw, v = (y.reshape(M * B, T, H, d) for y in projections)
        penalty = beta_logit = None
        if self.config.mixer == "deltanet":
            beta_logit = self._linear(x, f"{pre}.W_beta", bias=True).reshape(M * B, T, H)
        elif self.config.mixer in PENALTY_MIXERS:
            # W_u acts per head: the (member, head) pairs as the product's batch.
            k_heads = k_raw.view(M, B * T, H, d).transpose(1, 2).reshape(M * H, B * T, d)
            W_u = self.param(f"{pre}.W_u").reshape(M * H, d, d)
            penalty = _stacked_product(k_heads, W_u).view(M, H, B * T, d).transpose(1, 2)
            penalty = penalty.reshape(M * B, T, H, d)
        inputs = head_inputs(
            self.config.mixer, q_raw, k_raw, v, penalty=penalty, beta_logit=beta_logit
        )
        heads, _ = self._mixers[i].run_mixer(inputs)
        heads = self._layer_norm(heads.reshape(M, B, T, H * d), f"{pre}.norm")
        return self._linear(heads, f"{pre}.W_o")

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens`` ``[M, B, T]`` int64 -> logits ``[M, B, T, vocab]``."""
        if tokens.ndim != 3 or tokens.shape[0] != self.members:
            raise ConfigError(
                "tokens", f"expected [M={self.members}, B, T] token ids, got {tuple(tokens.shape)}"
            )
        M, B, T = tokens.shape
        table = self.param("embedding.weight")  # [M, V, D]
        V = table.shape[1]
        offsets = torch.arange(M, device=tokens.device).view(M, 1, 1) * V
        x = F.embedding(tokens + offsets, table.reshape(M * V, -1))
        if self.config.positions:
            if T > self.config.max_len:
                raise ConfigError(
                    "max_len", f"expected sequences of at most {self.config.max_len} tokens"
                )
            x = x + self.param("position.weight")[:, None, :T]
        for i in range(self.config.n_layers):
            x = x + self._attention(i, self._layer_norm(x, f"blocks.{i}.ln_attn"))
            h = self._layer_norm(x, f"blocks.{i}.ln_ffn")
            h = F.gelu(self._linear(h, f"blocks.{i}.ffn.0", bias=True))
            x = x + self._linear(h, f"blocks.{i}.ffn.2", bias=True)
        x = self._layer_norm(x, "ln_out")
        logits = _stacked_product(x.reshape(M, B * T, -1), table)  # the tied output projection
        return logits.view(M, B, T, V)


@torch.no_grad()
def clip_grad_norms(flat_grad: torch.Tensor, max_norm: float) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` for each member: row ``m`` of ``flat_grad`` ``[M, P]``
    (all of member ``m``'s gradients) is scaled by ``min(1, max_norm / (‖g_m‖ + 1e-6))``, with
    ``‖g_m‖`` the 2-norm of the row; ``max_norm`` ≤ 0 clips nothing.  Returns the norms
    ``[M]`` (the divergence check reads them either way); no host sync."""
    norms = flat_grad.square().sum(1).sqrt()
    if max_norm > 0:
        flat_grad.mul_((max_norm / (norms + 1e-6)).clamp(max=1.0).unsqueeze(1))
    return norms


class StackedAdamW:
    """AdamW as ``torch.optim.AdamW`` computes it (decoupled weight decay, bias-corrected
    moments, ``eps`` added to the corrected root) on a stack's parameters ``flat`` ``[M, P]``
    with gradients ``flat_grad``, with a learning rate per member: ``lr`` ``[M]`` (a tensor,
    set per step by the caller).  ``decay_mask`` ``[P]`` is 1 where weight decay acts.
    Elementwise, so member ``m`` is updated as its own AdamW would update it."""

    def __init__(
        self,
        flat: torch.Tensor,
        flat_grad: torch.Tensor,
        decay_mask: torch.Tensor,
        *,
        weight_decay: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        if flat.ndim != 2 or flat_grad.shape != flat.shape or decay_mask.shape != flat.shape[1:]:
            raise ConfigError(
                "flat", f"expected [M, P] parameters, gradients and a [P] mask, got "
                f"{tuple(flat.shape)}, {tuple(flat_grad.shape)}, {tuple(decay_mask.shape)}",
            )  # fmt: skip
        self.flat, self.flat_grad = flat, flat_grad
        self.decay = weight_decay * decay_mask
        self.betas = betas
        self.eps = eps
        self.lr = flat.new_zeros(flat.shape[0])
        self.step_count = 0
        self.exp_avg = torch.zeros_like(flat)
        self.exp_avg_sq = torch.zeros_like(flat)

    def zero_grad(self) -> None:
        self.flat_grad.zero_()  # the parameters' .grad are views of it: never None

    @torch.no_grad()
    def step(self) -> None:
        self.step_count += 1
        beta1, beta2 = self.betas
        correction1 = 1 - beta1**self.step_count
        root_correction2 = math.sqrt(1 - beta2**self.step_count)
        lr, g = self.lr.unsqueeze(1), self.flat_grad
        self.flat.mul_(1 - lr * self.decay)
        self.exp_avg.lerp_(g, 1 - beta1)
        self.exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        denom = (self.exp_avg_sq.sqrt() / root_correction2).add_(self.eps)
        self.flat.addcdiv_(self.exp_avg * (lr / correction1), denom, value=-1.0)

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step_count, "exp_avg": self.exp_avg, "exp_avg_sq": self.exp_avg_sq}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step_count = int(state["step"])
        self.exp_avg.copy_(state["exp_avg"])
        self.exp_avg_sq.copy_(state["exp_avg_sq"])

    @torch.no_grad()
    def reset_member(self, m: int) -> None:
        """Zero member ``m``'s parameters and moments (a diverged member: its NaNs must not
        reach a mixer that refuses non-finite input)."""
        for x in (self.flat, self.exp_avg, self.exp_avg_sq):
            x[m] = 0
