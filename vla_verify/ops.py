"""One entry point for VLA on a GPU: :func:`vla` picks the kernel for the call.

- The recurrent kernel (:func:`vla_verify.backends.triton_fused.fused_recurrent_vla`) for short
  sequences and decoding.
- The chunked kernel (:func:`vla_verify.backends.triton_chunked.chunked_vla`) for the forward
  from ``FORWARD_CROSSOVER_T`` tokens (long prefill) and for training from
  ``TRAINING_CROSSOVER_T`` tokens: per key width, the lengths where it was measured faster.

Both compute spec §2.3 with every :class:`~vla_verify.spec.VLAConfig` field and ``start``
honoured; the choice only changes speed and rounding.  torch and triton are imported on the
first call, never at ``import vla_verify``.

The entry point's own work is one attribute lookup per tensor and a comparison: no input
checks beyond the kernels' own, no conversions, no registry lookup (``benchmarks/gpu/
chunk_h200.py`` times it against the kernel called directly).

An inference call of the chunked kernel (no tensor requires grad, no initial state) of at
most ``GRAPH_MAX_TOKEN_HEADS[dk]`` token-heads replays a CUDA graph from the second call of one
signature on (shapes, strides, dtypes, device, configuration, ``start``): the chunked forward
issues about 25 host operations and 11 launches a call, which at a few thousand tokens take the
host longer than the device takes to run them (``docs/design/triton_chunked.md``, "The host's
work").  The replay copies the inputs into the graph's, runs the same kernels and returns copies
of its outputs, so it gives the eager call's results bit for bit; it holds the memory of one
forward per signature, for at most ``GRAPH_CAPACITY`` signatures (the least recently used goes
first; :func:`clear_graphs` frees them all; ``graphs=False`` never captures).  A call with an
initial state runs eagerly: the kernel reads back on the host whether the state's ``A`` is
positive definite (it chooses the penalty chain's blocks by it), which no graph can hold.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

from .spec import VLAConfig

__all__ = [
    "FORWARD_CROSSOVER_T",
    "GRAPH_CAPACITY",
    "GRAPH_MAX_TOKEN_HEADS",
    "TRAINING_CROSSOVER_T",
    "choose",
    "clear_graphs",
    "vla",
]

#: Sequence length from which the forward runs the chunked kernel, per key width: the row of
#: the narrowest width at least ``dk``; no row (keys wider than every row) or ``None``: never.
#: Each row is the first measured length from which the chunked kernel is faster than the
#: recurrent one, side by side (B = 1, H = 16, bf16, paper preset), ms chunked / recurrent, both
#: through this entry point (``benchmarks/gpu/entry_graphs.py`` on one H100,
#: ``benchmarks/results/h100/entry_graphs_aff2a37.json``; the chunked call replayed where
#: :data:`GRAPH_MAX_TOKEN_HEADS` has it, else eager; the lower of two repetitions): at D = 64
#: 0.666 / 0.820 (T = 1024), 0.535 / 1.67 (2048), 0.754 / 3.34 (4096); at D = 128 2.27 / 2.20
#: (2048), 1.94 / 4.43 (4096).
#: Shorter sequences at D = 64 are not measured, so the row stays at the first measured length.
#: At D = 128, T = 1024 the grid of ``benchmarks/results/h100/chunk_133f5d0.json`` has
#: 1.75 / 1.16.  The chunked kernel stays reachable with ``kernel="chunked"``.
FORWARD_CROSSOVER_T: dict[int, int | None] = {64: 1024, 128: 4096}
#: Sequence length from which training (inputs that require grad) runs the chunked kernel, per
#: key width (as :data:`FORWARD_CROSSOVER_T`).  Both backwards are the recurrent adjoint (the
#: chunked one from its forward's checkpoints and chain values).  Forward + backward, chunked
#: against recurrent, ms, from the same grid (``h100/chunk_133f5d0.json``): at
#: D = 64 2.60 / 2.54 (T = 1024), 4.61 / 7.54 (4096), 17.3 / 29.9 (16384), and
#: 8.88 / 6.53 at T = 2048 on the H200 (``h200/forward_crossover.json``, older kernels); at
#: D = 128 5.00 / 4.96 (1024), 15.9 / 19.8 (4096), 63.1 / 79.4 (16384).  The grid of
#: ``h100/chunk_131f844.json`` has 2.79 / 2.94 at D = 64, T = 1024, the other way round from
#: the grid above by about the spread between machines, ``h200/chunk.json`` (commit
#: ``9d069e1``) 2.44 / 2.50 at D = 64 and 4.79 / 4.75 at D = 128, T = 1024 (within 2.5 %), and
#: ``h100/chunk_1b3e657.json`` 2.31 / 2.37 and 5.02 / 4.96, ``h100/chunk_b07b137.json`` (commit
#: ``b07b137``) 3.49 / 3.27 and 5.10 / 4.94 (within 7 %; 4.24 / 6.86 and 15.4 / 19.9 at 4096),
#: ``h100/chunk_09c787e.json`` 2.53 / 2.58 and 4.90 / 4.98 (within 2 %), so the
#: rows stay at 4096.
TRAINING_CROSSOVER_T: dict[int, int | None] = {64: 4096, 128: 4096}

#: Inference calls of the chunked kernel replay a CUDA graph up to this many token-heads
#: (``B·T·H``; module docstring), per key width (the row of the narrowest width at least ``dk``;
#: no row: never): where the host's work is a large part of the call.  Side by side on one H100
#: (B = 1, H = 16, bf16, paper preset, ``benchmarks/gpu/entry_graphs.py``,
#: ``benchmarks/results/h100/entry_graphs_aff2a37.json``; replayed against eager, ms, the lower
#: of two repetitions): D = 64 0.666 / 0.662 at T = 1024, 0.535 / 0.857 at 2048, 0.754 / 0.867 at
#: 4096; D = 128 2.30 / 2.27 at 2048 and 1.99 / 1.94 at 4096, where the device's work is above
#: the host's and the replay's copies of the inputs and outputs cost more than the launches it
#: saves.  The bound stops at 8192 tokens of 16 heads, where the graph's memory (its inputs,
#: outputs and intermediates) grows with ``T`` and its gain does not.
GRAPH_MAX_TOKEN_HEADS: dict[int, int] = {64: 16 * 8192}
#: Signatures whose graphs are kept (the least recently used is dropped first).
GRAPH_CAPACITY = 4

_KERNELS: dict[str, Any] = {}


class _Replay:
    """A captured inference call: its input tensors, graph and outputs (``None``: the capture
    failed and the signature runs eagerly)."""

    __slots__ = ("graph", "inputs", "outputs")

    def __init__(self, graph: Any, inputs: list[Any], outputs: list[Any]) -> None:
        self.graph, self.inputs, self.outputs = graph, inputs, outputs


class _GraphCache:
    """The graphs of :func:`vla`'s inference calls by signature (module docstring).  A
    signature is captured on its second call, so calls that never repeat (a changing ``start``,
    one-off shapes) never pay for a capture; ``capture`` is :func:`_capture` (a stand-in in the
    tests)."""

    def __init__(self, capture: Callable[..., _Replay | None]) -> None:
        self.capture = capture
        self.seen: OrderedDict[Hashable, None] = OrderedDict()
        self.graphs: OrderedDict[Hashable, _Replay | None] = OrderedDict()

    def clear(self) -> None:
        self.seen.clear()
        self.graphs.clear()

    def __call__(self, key: Hashable, fn: Callable[..., Any], tensors: list[Any],
                 unflatten: Callable[[list[Any]], Any]) -> Any:  # fmt: skip
        """``fn(*tensors)`` (a flat list of output tensors), replayed when ``key`` has been
        called before; ``unflatten`` turns copies of the outputs into the call's result."""
        if key in self.graphs:
            self.graphs.move_to_end(key)
            replay = self.graphs[key]
        elif key in self.seen:
            del self.seen[key]
            replay = self.capture(fn, tensors)
            self.graphs[key] = replay
            while len(self.graphs) > GRAPH_CAPACITY:
                self.graphs.popitem(last=False)
        else:
            self.seen[key] = None
            while len(self.seen) > 4 * GRAPH_CAPACITY:
                self.seen.popitem(last=False)
            return unflatten(fn(*tensors))
        if replay is None:
            return unflatten(fn(*tensors))
        for mine, x in zip(replay.inputs, tensors, strict=True):
            mine.copy_(x)
        replay.graph.replay()
        return unflatten([y.clone() for y in replay.outputs])


def _capture(fn: Callable[..., list[Any]], tensors: list[Any]) -> _Replay | None:
    """``fn`` captured in a CUDA graph on copies of ``tensors``, after one call on a side
    stream (cuBLAS's workspaces and the kernels' builds happen outside the capture); ``None``
    when the capture fails (the call then runs eagerly)."""
    import torch

    inputs = [x.clone() for x in tensors]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(*inputs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            outputs = fn(*inputs)
    except RuntimeError:
        return None
    return _Replay(graph, inputs, outputs)


_GRAPHS = _GraphCache(_capture)


def clear_graphs() -> None:
    """Drop every CUDA graph :func:`vla` keeps (and the memory they hold)."""
    _GRAPHS.clear()


def _kernel(name: str) -> Any:
    fn = _KERNELS.get(name)
    if fn is None:
        if name == "chunked":
            from .backends.triton_chunked import chunked_vla as fn
        else:
            from .backends.triton_fused import fused_recurrent_vla as fn
        _KERNELS[name] = fn
    return fn


def _row(table: dict[int, int | None] | dict[int, int], dk: int | None) -> int | None:
    """The row of the narrowest width at least ``dk`` (``None``: the narrowest row); ``None``
    where no width is that wide."""
    widths = sorted(w for w in table if dk is None or w >= dk)
    return table[widths[0]] if widths else None


def choose(T: int, training: bool, dk: int | None = None) -> str:
    """``"chunked"`` or ``"recurrent"`` for a call of ``T`` tokens with key width ``dk``
    (``None``: the narrowest row; module docstring)."""
    crossover = _row(TRAINING_CROSSOVER_T if training else FORWARD_CROSSOVER_T, dk)
    if crossover is not None and T >= crossover:
        return "chunked"
    return "recurrent"


def vla(
    q: Any,
    k: Any,
    v: Any,
    u: Any,
    *,
    config: VLAConfig | None = None,
    initial_state: tuple[Any, Any, Any] | None = None,
    start: int = 0,
    kernel: str | None = None,
    graphs: bool = True,
) -> tuple[Any, tuple[Any, Any, Any]]:
    """VLA (spec §2.3) through the kernel that suits the call.

    Parameters
    ----------
    q, k, u : ``[B, T, H, dk]``; v : ``[B, T, H, dv]`` torch tensors on a CUDA device (spec §1).
    config : :class:`VLAConfig` (default the paper preset).
    initial_state : ``(S, A, z)`` to continue from, or ``None``: in the inputs' dtype or in
        float32, as a call returns it (a prefill's state passes to the next call as it is).
    start : tokens consumed before the call (spec §2.3: the nudge clock continues).
    kernel : ``None`` (choose by :func:`choose`), ``"chunked"`` or ``"recurrent"``.
    graphs : replay inference calls of the chunked kernel from CUDA graphs (module docstring).

    Returns
    -------
    ``o`` ``[B, T, H, dv]`` in the inputs' dtype and the state ``(S, A, z)`` (float32 for
    16-bit and float32 inputs).
    """
    training = q.requires_grad or k.requires_grad or v.requires_grad or u.requires_grad
    if kernel is None:
        kernel = choose(q.shape[1], training, q.shape[-1])
    elif kernel not in ("chunked", "recurrent"):
        from .errors import VLAInputError

        raise VLAInputError("kernel", f"expected None, 'chunked' or 'recurrent', got {kernel!r}")
    fn = _kernel(kernel)
    if kernel == "chunked":
        if graphs and not training and initial_state is None and q.is_cuda:
            bound = _row(GRAPH_MAX_TOKEN_HEADS, q.shape[-1])
            if bound is not None and q.shape[0] * q.shape[1] * q.shape[2] <= bound:
                return _graphed(fn, q, k, v, u, config, start)
        return fn(q, k, v, u, config=config, initial_state=initial_state, start=start)  # type: ignore[no-any-return]
    if start:
        return fn(q, k, v, u, config=config, initial_state=initial_state, start=start)  # type: ignore[no-any-return]
    return fn(q, k, v, u, config=config, initial_state=initial_state)  # type: ignore[no-any-return]


def _graphed(fn: Any, q: Any, k: Any, v: Any, u: Any, config: VLAConfig | None,
             start: int) -> Any:  # fmt: skip
    """The chunked inference call without an initial state through :data:`_GRAPHS`; eager
    while a graph is being captured (the caller's)."""
    import torch

    if torch.cuda.is_current_stream_capturing():
        return fn(q, k, v, u, config=config, start=start)
    tensors = [q, k, v, u]
    key = (
        tuple((x.shape, x.stride(), x.dtype, x.device) for x in tensors),
        VLAConfig() if config is None else config,
        start,
    )

    def call(*x: Any) -> list[Any]:
        o, state = fn(*x, config=config, start=start)
        return [o, *state]

    return _GRAPHS(key, call, tensors, lambda y: (y[0], (y[1], y[2], y[3])))
