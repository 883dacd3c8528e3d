"""The pivots' micro-benchmark (``benchmarks/prototypes/warp_local_elimination.py``): its check
passes the shipped elimination and rejects a planted slip, under Triton's interpreter on the
CPU; its Gluon kernels build for sm_90 with no barrier in their pivots' loop, where the shipped
elimination on a loaded tile has some.  The Gluon kernels do not run under the interpreter:
their results are checked on a GPU, before any timing, by the same :func:`check`."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

_PATH = (Path(__file__).resolve().parents[1] / "benchmarks" / "prototypes"
         / "warp_local_elimination.py")  # fmt: skip
_spec = importlib.util.spec_from_file_location("warp_local_elimination", _PATH)
assert _spec is not None and _spec.loader is not None
wle = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(wle)

_PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


def test_the_reference_is_the_ldl_factorisation() -> None:
    _, G = wle.make_inputs(2, 1)
    W, d = wle.reference(G[:, 0])
    M = np.eye(wle.P) + G[:, 0].astype(np.float64)
    L = np.linalg.inv(W)
    assert np.allclose(np.tril(L), L) and np.allclose(np.diagonal(L, axis1=1, axis2=2), 1)
    assert np.allclose(L @ (d[..., None] * np.swapaxes(L, 1, 2)), M, rtol=1e-12, atol=1e-12)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs the interpreter")
@pytest.mark.parametrize("from_dot", [0, 1, 2, 3])
def test_the_shipped_elimination_passes_and_a_planted_slip_fails(from_dot: int) -> None:
    U, G = wle.make_inputs(3, 3)
    u, g = torch.from_numpy(U), torch.from_numpy(G)
    W, d = wle.run(wle.elimination_triton_kernel, g, u, 3, from_dot=from_dot)
    worst = max(wle.check(W[p].numpy(), d[p].numpy(), G[p, -1]) for p in range(3))
    assert worst < 0.5
    W, d = wle.run(wle.elimination_triton_kernel, g, u, 3, bug=wle.BUG_UNSOLVED_ROW,
                   from_dot=from_dot)  # fmt: skip
    assert min(wle.check(W[p].numpy(), d[p].numpy(), G[p, -1]) for p in range(3)) > 10


@pytest.mark.skipif(not _PTXAS.is_file(), reason="Triton without its ptxas")
def test_the_gluon_elimination_builds_for_sm90_without_barriers(tmp_path: Path) -> None:
    pytest.importorskip("triton.experimental.gluon")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "rows.json"
    done = subprocess.run([sys.executable, str(_PATH), "--preflight", str(out)], env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert out.is_file(), done.stderr[-3000:]
    import json

    rows = {r["kernel"]: r["pivot_loop"] for r in json.loads(out.read_text())["rows"]}
    assert rows["gluon"]["bar"] == 0 and rows["gluon_from_dot"]["bar"] == 0
    # The count can fail: the shipped elimination's reductions cross its warps on a loaded tile.
    assert rows["triton"]["bar"] > 0


def test_the_pivot_loop_is_the_innermost_loop_of_a_listing() -> None:
    listing = "\n".join([
        "        /*0000*/                   MOV R1, c[0x0][0x28] ;",
        ".L_x_0:",
        "        /*0010*/                   FADD R2, R2, R3 ;",
        ".L_x_1:",
        "        /*0020*/                   SHFL.BFLY PT, R6, R4, 0x1, 0x1f ;",
        "        /*0030*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;",
        "        /*0040*/                   FFMA R4, R4, R6, R4 ;",
        "        /*0050*/              @P0  BRA `(.L_x_1) ;",
        "        /*0060*/                   STG.E [R8], R2 ;",
        "        /*0070*/              @P1  BRA `(.L_x_0) ;",
        "        /*0080*/                   EXIT ;",
    ])  # fmt: skip
    assert wle.pivot_loop(listing) == {"instructions": 4, "bar": 1, "shfl": 1}
