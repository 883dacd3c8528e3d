"""The Triton chunked backend ``triton_chunked`` built for a CUDA GPU: what only the compiled
kernels can get wrong (skipped without a GPU and under Triton's interpreter; the interpreter's
tests are ``tests/test_triton_chunked.py``).

The training forward stores what the backward reads (the penalty kernel's ``A`` checkpoints and
per-token chain values, the read-out's values) and must otherwise be the inference forward.  A
build of the penalty kernel with both of its stores at D = 128 left the chain non-finite on
sm_90 while either store alone did not (``benchmarks/results/h100/block_check_training_fcb06ea
.json``), and under the interpreter both ways agree: so the comparison runs here, at the sizes
of the GPU plans.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from vla_verify import VLAConfig  # noqa: E402

tc = pytest.importorskip("vla_verify.backends.triton_chunked")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.triton,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(tc.interpreted(), reason="the compiled kernels (TRITON_INTERPRET unset)"),
]


def _inputs(
    T: int, H: int, D: int, seed: int = 0, dtype: torch.dtype = torch.bfloat16
) -> list[torch.Tensor]:
    """Layer-like inputs ``[1, T, H, D]`` (spec §2.5): positive q, k; ``‖u‖² = 1/D``."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    shape = (1, T, H, D)
    q, k = (torch.exp(0.5 * torch.randn(shape, device="cuda", generator=g)) for _ in range(2))
    v = torch.randn(shape, device="cuda", generator=g)
    u = torch.randn(shape, device="cuda", generator=g)
    u = u / u.norm(dim=-1, keepdim=True) / D**0.5
    return [x.to(dtype) for x in (q, k, v, u)]


@pytest.mark.parametrize("D", [64, 128])
def test_training_forward_is_the_inference_forward(D: int) -> None:
    """At T = 4096 in blocks (the plan's), the paper preset, float16 inputs, whose inference
    forward runs the float64 penalty chain and float32 state-side intermediates as training
    does (bf16 inference takes the float32 chain and bf16 intermediates: ``_penalty_dtype``,
    ``_state_dtype``): the forward with inputs that need gradients gives the inference
    forward's output and state bit for bit, finite, with no block-start fallback, and finite
    gradients; with planted wrong block starts the check fails in training too (the fallback
    counted).  The float64 chain reads float32 copies of the keys and penalties, so its kernel
    is the one bf16 inputs run; in bf16 its ``A`` is compared alone."""
    config = VLAConfig()
    Tensors = list[torch.Tensor]

    def forward(
        x0: Tensors, grad: bool, bug: str | None = None, **options: str
    ) -> tuple[Tensors, Tensors]:
        x = [a.clone().requires_grad_(grad) for a in x0]
        o, state = tc.chunked_vla(*x, config=config, planted_bug=bug, **options)
        return [o, *state], x

    x0 = _inputs(4096, 16, D, dtype=torch.float16)
    before = tc.BLOCK_START_FALLBACKS[0]
    inference, _ = forward(x0, grad=False)
    training, leaves = forward(x0, grad=True)
    assert tc.BLOCK_START_FALLBACKS[0] == before
    for name, got, want in zip(("o", "S", "A", "z"), training, inference, strict=True):
        assert torch.isfinite(got).all(), name
        assert torch.equal(got.detach(), want), name
    do = torch.randn_like(training[0])
    grads = torch.autograd.grad(training[0], leaves, do)
    for name, g in zip("qkvu", grads, strict=True):
        assert torch.isfinite(g).all(), f"d{name}"
    forward(x0, grad=True, bug="block_starts_without_nudges")
    assert tc.BLOCK_START_FALLBACKS[0] == before + 1
    x0 = _inputs(4096, 16, D)
    inference, _ = forward(x0, grad=False, penalty_dtype="float64")
    training, leaves = forward(x0, grad=True)
    assert tc.BLOCK_START_FALLBACKS[0] == before + 1
    assert torch.equal(training[2].detach(), inference[2]), "A"
    grads = torch.autograd.grad(training[0], leaves, torch.randn_like(training[0]))
    for name, t in zip(("o", "dq", "dk", "dv", "du"), (training[0], *grads), strict=True):
        assert torch.isfinite(t).all(), name


def _captured(fn, statics: list[torch.Tensor]):  # type: ignore[no-untyped-def]
    """``fn(*statics)`` captured in a CUDA graph after warm-up calls on a side stream: the
    replay and the captured outputs."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn(*statics)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(*statics)
    return graph.replay, out


@pytest.mark.parametrize(("D", "T"), [(64, 4096), (128, 4096), (64, 1024)])
def test_the_forward_replays_from_a_cuda_graph(D: int, T: int) -> None:
    """The inference forward waits for the device nowhere (its block-start check and second
    pass stay on the device), so it can be captured in a CUDA graph: replayed on new inputs
    copied into the captured ones it gives the eager forward's output and state bit for bit,
    and a planted fallback (wrong block starts) counts once per replay."""
    config = VLAConfig()
    statics = [x.clone() for x in _inputs(T, 16, D, seed=1)]

    def forward(*x: torch.Tensor) -> list[torch.Tensor]:
        o, state = tc.chunked_vla(*x, config=config)
        return [o, *state]

    replay, captured = _captured(forward, statics)
    fresh = _inputs(T, 16, D, seed=2)
    for s, x in zip(statics, fresh, strict=True):
        s.copy_(x)
    replay()
    torch.cuda.synchronize()
    for name, got, want in zip(("o", "S", "A", "z"), captured, forward(*fresh), strict=True):
        assert torch.equal(got, want), name

    def planted(*x: torch.Tensor) -> list[torch.Tensor]:
        o, state = tc.chunked_vla(*x, config=config, planted_bug="block_starts_without_nudges")
        return [o, *state]

    if tc.penalty_block_length(T, 16, dk=D, heads=16, device="cuda") >= T:
        return  # one block: no starts to plant
    replay, captured = _captured(planted, statics)
    before = tc.BLOCK_START_FALLBACKS[0]
    replay()
    replay()
    assert tc.BLOCK_START_FALLBACKS[0] == before + 2
    torch.cuda.synchronize()
    for name, got, want in zip(("o", "S", "A", "z"), captured, planted(*statics), strict=True):
        assert torch.equal(got, want), name


def test_a_capture_leaves_no_unfilled_tensor_in_the_caches() -> None:
    """The forward caches its identity and zero state; a tensor made while a graph is captured
    is filled only when the graph replays, so a capture that meets an empty cache must not fill
    it: after such a capture, an eager call gives the same output as before the caches were
    emptied."""
    config = VLAConfig()
    statics = [x.clone() for x in _inputs(4096, 16, 64, seed=3)]

    def forward(*x: torch.Tensor) -> list[torch.Tensor]:
        o, state = tc.chunked_vla(*x, config=config)
        return [o, *state]

    want = forward(*statics)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # build the kernels outside the capture
        forward(*statics)
    torch.cuda.current_stream().wait_stream(side)
    tc._IDENTITIES.clear()
    tc._ZERO_STATES.clear()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        forward(*statics)
    assert not tc._IDENTITIES and not tc._ZERO_STATES
    for name, got, ref in zip(("o", "S", "A", "z"), forward(*statics), want, strict=True):
        assert torch.equal(got, ref), name


def test_the_entry_points_graphs_give_the_eager_calls_results() -> None:
    """``ops.vla``'s inference calls of the chunked kernel: the first eager, the second
    captured, the later ones replayed, each on fresh inputs, equal ``chunked_vla`` called
    directly bit for bit; so do the calls with a state and a ``start``, which run eagerly; one
    graph is kept."""
    from vla_verify import ops

    config = VLAConfig()
    ops.clear_graphs()
    for seed in range(4):
        x = _inputs(4096, 16, 64, seed=seed)
        got = ops.vla(*x, config=config, kernel="chunked")
        want = tc.chunked_vla(*x, config=config)
        for name, a, b in zip(("o", "S", "A", "z"), (got[0], *got[1]), (want[0], *want[1]),
                              strict=True):  # fmt: skip
            assert torch.equal(a, b), (seed, name)
    state = tuple(t.clone() for t in want[1])  # float32, as returned
    want = tc.chunked_vla(*x, config=config, initial_state=state, start=7)
    for _ in range(3):
        got = ops.vla(*x, config=config, kernel="chunked", initial_state=state, start=7)
        for a, b in zip((got[0], *got[1]), (want[0], *want[1]), strict=True):
            assert torch.equal(a, b)
    assert len(ops._GRAPHS.graphs) == 1 and all(ops._GRAPHS.graphs.values())
    ops.clear_graphs()
