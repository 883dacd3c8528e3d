"""The host's work per call of the chunked forward: PyTorch operations and Triton launches.

Up to a few thousand tokens the chunked forward's eager time is the host's, not the device's
(``docs/design/triton_chunked.md``, "The host's work"): on the H100 a PyTorch operation costs the
host tens of microseconds and a Triton launch about a hundred.  These tests count what one call
issues, with every kernel replaced by a recorder of its launch (no kernel runs; the counts do
not depend on the numbers), and hold the counts to :data:`HOST_OPERATIONS`: an operation added to
the forward must be worth its cost and raise the budget here.  The meta-test plants one
operation more and must be caught.
"""

from __future__ import annotations

import collections
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from vla_verify import VLAConfig  # noqa: E402

tc = pytest.importorskip("vla_verify.backends.triton_chunked")

pytestmark = [
    pytest.mark.triton,
    pytest.mark.skipif(not tc.interpreted(), reason="counts launches of the interpreter's kernels"),
]

#: Per call of the bf16 inference forward (B = 1, H = 16, dk = dv = 64, paper preset, no initial
#: state; the float32 penalty chain, which reads the bf16 keys and penalties): PyTorch
#: operations that are not views, and Triton launches.  One block (12 and 4): ten buffers
#: (``z`` at the chunk starts and at the end among them, summed by the state chain's kernel),
#: the penalty scratch (a copy of the start), the initial ``A`` (the cached identity divided by
#: ``lambda0``); four launches.  (The float64 chain adds the keys and penalties in float32 and
#: the last ``A`` in float32.)  Four blocks add 14 and 7: the blocks' matrices (a buffer, the
#: last one zeroed, a launch; float32 matrices of the bf16 penalties as they are, where the
#: float64 ones read a float32 copy), the starts (a buffer, ``(A_0; I)`` in
#: two copies, one launch for the three products, the solve: the float32 chain's Cholesky
#: form in two products, a factorisation and a triangular solve, an LU's a solve and a
#: symmetrisation), the
#: block-end check (the flag zeroed, one launch, the fallback count), the second pass (its
#: scratch, four launches that return at once on the device where the check passed) and the
#: choice of the last ``A`` (the flag as a mask, a selection).
HOST_OPERATIONS = {"one_block": (12, 4), "four_blocks": (26, 11)}


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if not func.is_view:
            self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[str]:
    """Every kernel of the chunked backend replaced by a recorder of its launches."""
    counted: collections.Counter[str] = collections.Counter()

    class Recorder:
        def __init__(self, name: str) -> None:
            self.name = name

        def __getitem__(self, grid: Any) -> Any:
            def launch(*args: Any, **kwargs: Any) -> None:
                counted[self.name] += 1

            return launch

    for name in dir(tc.kernels):
        if name.endswith("_kernel") and callable(getattr(tc.kernels, name)):
            monkeypatch.setattr(tc.kernels, name, Recorder(name))
    return counted


def _count(launches: collections.Counter[str], T: int, block: int) -> tuple[int, int, _Count]:
    g = torch.Generator().manual_seed(0)
    x = [torch.randn(1, T, 16, 64, generator=g).to(torch.bfloat16) for _ in range(4)]
    cfg = VLAConfig()
    tc.chunked_vla(*x, config=cfg, penalty_block=block)  # the caches filled
    launches.clear()
    with _Count() as count:
        tc.chunked_vla(*x, config=cfg, penalty_block=block)
    return sum(count.ops.values()), sum(launches.values()), count


@pytest.mark.parametrize(
    ("case", "T", "block"), [("one_block", 256, 256), ("four_blocks", 256, 64)]
)
def test_host_operations_per_forward_stay_within_the_budget(
    launches: collections.Counter[str], case: str, T: int, block: int
) -> None:
    ops, kernels, count = _count(launches, T, block)
    budget_ops, budget_launches = HOST_OPERATIONS[case]
    assert kernels <= budget_launches, dict(launches)
    assert ops <= budget_ops, dict(count.ops)


def test_a_planted_operation_exceeds_the_budget(
    launches: collections.Counter[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Meta-test: the block starts with one copy more per call fail the four-block budget."""
    starts = tc.penalty_block_starts

    def with_a_copy(*args: Any, **kwargs: Any) -> torch.Tensor:
        return starts(*args, **kwargs).clone()

    monkeypatch.setattr(tc, "penalty_block_starts", with_a_copy)
    ops, _, _ = _count(launches, 256, 64)
    assert ops > HOST_OPERATIONS["four_blocks"][0]


@pytest.mark.parametrize("capturing", [False, True])
def test_tensors_made_during_a_graph_capture_are_not_cached(
    launches: collections.Counter[str], monkeypatch: pytest.MonkeyPatch, capturing: bool
) -> None:
    """A tensor made while a CUDA graph is captured is filled only when the graph replays, so
    the cached identity and zero state are cached only outside a capture (the capture stood in
    for on the CPU; outside one the caches do fill, so the check can fail)."""
    monkeypatch.setattr(tc, "_capturing", lambda device: capturing)
    monkeypatch.setattr(tc, "_IDENTITIES", {})
    monkeypatch.setattr(tc, "_ZERO_STATES", {})
    _count(launches, 64, 64)
    assert bool(tc._IDENTITIES) == bool(tc._ZERO_STATES) == (not capturing)
