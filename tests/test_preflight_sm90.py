"""``benchmarks/preflight_sm90.py`` builds the kernels a GPU plan launches for the H200 without a
GPU: the default plan's kernels (the pieces included) fit an SM, and the chunked state adjoint
at 128-wide keys in one launch or with its scan's default pipeline, which the H200 and an H100
refused with ``OutOfResources``, is found not to (as the package builds it there, it fits)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
triton = pytest.importorskip("triton")

_TOOL = Path(__file__).resolve().parents[1] / "benchmarks" / "preflight_sm90.py"
_PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
pytestmark = pytest.mark.skipif(not _PTXAS.is_file(), reason="Triton without its ptxas")


def _preflight(tmp_path: Path, *args: str) -> tuple[int, list[dict]]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "rows.json"
    done = subprocess.run([sys.executable, str(_TOOL), *args, "--json", str(out)], env=env,
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert out.is_file(), done.stderr[-3000:]
    return done.returncode, json.loads(out.read_text())["rows"]


def test_the_default_plan_and_the_pieces_fit(tmp_path: Path) -> None:
    code, rows = _preflight(tmp_path, "--sizes", "64x256", "--options", "chunked_penalty_adjoint=1")
    kernels = {r["kernel"] for r in rows}
    assert {"vla_state_bwd_chunk_kernel", "vla_penalty_bwd_scan_kernel",
            "vla_penalty_bwd_piece_kernel"} <= kernels  # fmt: skip
    # The forward's state kernels are built too, with bf16 intermediates and products (the
    # bf16 inference forward) and with float32 ones (training).
    kernels_of_the_state = ("state_prep_kernel", "state_starts_kernel", "state_output_kernel")
    assert set(kernels_of_the_state) <= kernels
    for name in kernels_of_the_state:
        assert {r["constexprs"].get("OP") for r in rows if r["kernel"] == name} == {"bf16", "fp32"}
    assert code == 0 and all(r["fits"] and r["shared"] > 0 for r in rows), rows


def test_the_wide_chunked_adjoints_fit_only_split(tmp_path: Path) -> None:
    """Known answers: at BK = 128 the scan kernel of the state adjoint with Triton's default
    pipeline asks more shared memory than an sm_90 SM has (an H100 raised OutOfResources with
    242176 bytes, ``h100/adjoint_d128_f61ae7f.json``), and the tool says so; the chunk kernel in
    one launch keeps its sums partly on the stack
    (``sm90/preflight_state_chunk_value_walk.json``).  Built as the package builds them there
    (the chunk kernel over three launches, the scan and the pieces' kernels with one pipeline
    stage) every kernel fits."""
    options = ("--options", "chunked_state_adjoint=1", "chunked_penalty_adjoint=1")
    code, rows = _preflight(tmp_path, "--sizes", "128x256", *options, "--unsplit")
    chunk = [r for r in rows if r["kernel"] == "vla_state_bwd_chunk_kernel"]
    assert chunk and chunk[0]["stack"] > 0
    scan = [r for r in rows if r["kernel"] == "vla_state_bwd_scan_kernel"]
    assert scan and not scan[0]["fits"] and scan[0]["shared"] > 232448
    assert code == 1
    code, rows = _preflight(tmp_path, "--sizes", "128x256", *options)
    kernels = {r["kernel"] for r in rows}
    assert {"vla_state_bwd_chunk_kernel", "vla_penalty_bwd_scan_kernel",
            "vla_penalty_bwd_piece_kernel"} <= kernels  # fmt: skip
    assert code == 0 and all(r["fits"] for r in rows), [r for r in rows if not r["fits"]]
