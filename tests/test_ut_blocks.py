"""The blocked UT transform of ``benchmarks/prototypes/ut_blocks.py`` against the shipped
``state_prep_kernel`` (Triton's interpreter): the same ``K̃, Ṽ`` to float32 rounding at every
chunk size, key and value width and a short last chunk; a slip in a block below the diagonal
must show."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from vla_verify.backends import triton_chunked_kernels as kernels  # noqa: E402
from vla_verify.backends.triton_common import built_for_interpreter  # noqa: E402

pytestmark = pytest.mark.skipif(
    not built_for_interpreter(kernels.state_starts_kernel), reason="needs TRITON_INTERPRET=1"
)

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "prototypes" / "ut_blocks.py"
_spec = importlib.util.spec_from_file_location("ut_blocks", _PATH)
assert _spec is not None and _spec.loader is not None
ut = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ut)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize(("C", "dk", "dv", "T"), [(16, 8, 12, 40), (32, 40, 20, 70),
                                                  (64, 24, 16, 150)])  # fmt: skip
def test_blocked_ut_transform_equals_the_shipped_one(C: int, dk: int, dv: int, T: int) -> None:
    k, v, gates, params = ut.inputs(1, T, 2, dk, dv, torch.float32, "cpu", C)
    Kt, Vt = ut.launch(kernels.state_prep_kernel, k, v, gates, params, C)
    Kb, Vb = ut.launch(ut.state_prep_blocks_kernel, k, v, gates, params, C)
    assert _rel(Kb, Kt) < 1e-5 and _rel(Vb, Vt) < 1e-5
    # T_20 without its N_21 T_10 term (a planted slip) must be seen.
    if C == 64:
        Kw, _ = ut.launch(ut.state_prep_blocks_kernel, k, v, gates, params, C, BUG=1)
        assert _rel(Kw, Kt) > 1e-3
