"""The state-norm probe: ``||S_t||_F`` per layer over t (spec §3 C5, C6; imports torch).

A backbone reads one sequence of ``T`` tokens drawn uniformly from ``[2, vocab)`` with a fixed
seed; in every block the mixer runs in segments that end at the probe's time points, each
segment continuing the state and the nudge clock of the one before (spec §2.3: ``start``), so
the state after the segment ending at ``t`` is ``S_t`` exactly.  The segments' outputs are
concatenated and passed to the next block, so layer 2 sees what it sees in a full forward pass.

``vla``, ``linear`` and ``delta`` run on the ``torch`` backend (the one that continues the
nudge clock from any ``start``), ``deltanet`` on :func:`~.model.gated_delta_rule`.  The
figure per layer and t is ``||S_t||_F`` of every head (``[H]``) and their mean.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .. import backends
from ..errors import ConfigError
from .model import RECURRENT_MIXERS, AttentionLayer, Backbone, gated_delta_rule

__all__ = ["probe_points", "probe_tokens", "state_norms"]


def probe_points(T: int, count: int = 48, extra: tuple[int, ...] = (1000,)) -> list[int]:
    """About ``count`` time points in ``[1, T]``, log-spaced, with ``T`` and each of ``extra``
    that is at most ``T`` (1000 is the paper's C6 length)."""
    if T < 1:
        raise ConfigError("T", f"expected a positive length, got {T}")
    points = set(np.unique(np.round(np.logspace(0, np.log10(T), count)).astype(int)).tolist())
    points |= {T, *(e for e in extra if e <= T)}
    return sorted(points)


def probe_tokens(T: int, vocab: int, seed: int) -> np.ndarray:
    """The probe's input: ``[1, T]`` int64 tokens uniform on ``[2, vocab)``."""
    rng = np.random.default_rng([int(seed), 7])
    return rng.integers(2, vocab, size=(1, T)).astype(np.int64)


def _segments(layer: AttentionLayer, inputs: dict[str, torch.Tensor], points: list[int]):
    """Run ``layer``'s mixer segment by segment; yield ``(output, S after the segment)``."""
    if layer.mixer == "deltanet":
        state = None
        begin = 0
        for end in points:
            seg = {name: x[:, begin:end] for name, x in inputs.items()}
            o, state = gated_delta_rule(seg["q"], seg["k"], seg["v"], seg["beta"], state)
            yield o, state
            begin = end
        return
    backend = backends.get("torch", variant=layer.mixer)
    state3: Any = None
    begin = 0
    for end in points:
        seg = {name: x[:, begin:end] for name, x in inputs.items()}
        o, state3 = backend(
            seg["q"],
            seg["k"],
            seg["v"],
            seg["u"],
            config=layer.vla_config,
            initial_state=state3,
            start=begin,
        )
        yield o, state3[0]
        begin = end


@torch.no_grad()
def state_norms(
    model: Backbone, T: int, *, seed: int = 0, device: str = "cpu", count: int = 48
) -> dict[str, Any]:
    """``{"t": [...], "layers": [{"mean": [...], "heads": [[...] per t]}, ...]}``: ``||S_t||_F``
    per layer and head at the :func:`probe_points` of ``T``, for a recurrent mixer."""
    if model.config.mixer not in RECURRENT_MIXERS:
        raise ConfigError("mixer", f"expected one of {RECURRENT_MIXERS}, got {model.config.mixer}")
    model.to(device).eval()
    points = probe_points(T, count)
    tokens = torch.as_tensor(probe_tokens(T, model.config.vocab, seed), device=device)
    x = model.embed(tokens)
    layers = []
    for block in model.layers():
        layer = block.attn
        inputs = layer.mixer_inputs(block.ln_attn(x))
        outputs, heads = [], []
        for o, S in _segments(layer, inputs, points):
            outputs.append(o)
            heads.append(torch.linalg.matrix_norm(S[0].double()).cpu().tolist())  # [H]
        o = torch.cat(outputs, dim=1)
        x = x + layer.W_o(layer.norm(o.reshape(1, T, -1)))
        x = x + block.ffn(block.ln_ffn(x))
        layers.append({"mean": [float(np.mean(h)) for h in heads], "heads": heads})
    model.train()
    return {"t": points, "layers": layers}
