"""The benchmark harness (``vla-verify bench``) on the CPU: tiny sizes, the torch backends.

Its correctness gates must be able to stop the timing: a planted wrong forward (the validate
gate) and a planted wrong gradient with a right forward (the gradient gate) each turn a gate
red, and then nothing is timed.  The JSON keeps the format of the stored GPU results
(``benchmarks/results/h200/fused.json``).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from vla_verify import backends
from vla_verify.bench import SUITES, GateSizes, Record, fitted_exponents, run_suite, write_outputs
from vla_verify.proofs.claims import c9_kernel_speed

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
ROOT = Path(__file__).resolve().parents[1]
STORED = ROOT / "benchmarks" / "results" / "h200" / "fused.json"
STORED_CHUNK = ROOT / "benchmarks" / "results" / "h200" / "chunk.json"

TINY = {
    "Ts": (8, 16),
    "Ds": (4,),
    "H": 1,
    "device": "cpu",
    "gate_sizes": GateSizes.small(),
    "show_progress": False,
    "log": lambda message: None,
}


class CountingTimer:
    """The harness's clock, counting the ops it is asked to time."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, fn: Any) -> float:
        self.calls += 1
        fn()
        return 1.0


@needs_torch
def test_torch_suite_writes_the_stored_format(tmp_path):
    timer = CountingTimer()
    run = run_suite("torch", timer=timer, **TINY)
    assert run.passed, run.correctness
    files = write_outputs(run, tmp_path)
    data = json.loads(files["json"].read_text())
    assert files["json"].name == SUITES["torch"].output == "torch.json"
    assert set(data) == {"suite", "machine", "records", "correctness", "tuning"}
    for key in ("gpu", "driver", "torch", "triton", "fla", "commit", "timer"):
        assert key in data["machine"]
    kinds = {key.split("_")[0] for key in data["correctness"]}
    assert kinds == {"validate", "grad", "finite"}
    assert all(g["passed"] for g in data["correctness"].values())
    ops = {(r["op"], r["mode"], r["T"]) for r in data["records"]}
    expected = {
        (op, m, T)
        for op in ("torch_chunked", "torch", "sdpa")
        for m in SUITES["torch"].modes
        for T in (8, 16)
    }
    assert ops == expected
    assert timer.calls == len(expected)
    for r in data["records"]:
        assert set(r) == {"op", "B", "T", "H", "D", "dtype", "mode", "median_ms"}
        assert (r["B"], r["H"], r["D"], r["dtype"]) == (1, 1, 4, "bfloat16")
    if "plot" in files:  # matplotlib installed
        assert files["plot"].stat().st_size > 0


class WrongForward:
    """A kernel put in the chunked backend's place: the sequential backend (cheaper to shrink a
    counterexample with) with its output scaled by 1 + 2^-7, a bug far outside the float32
    budget."""

    def __init__(self) -> None:
        self.inner = backends.get("torch")

    def __call__(self, q, k, v, u, **kw):
        o, state = self.inner(q, k, v, u, **kw)
        return o * (1 + 2**-7), state


class WrongGradient(WrongForward):
    """The same forward bit for bit, with a spurious gradient of u (a term that is zero in value
    and not in derivative)."""

    def __call__(self, q, k, v, u, **kw):
        o, state = self.inner(q, k, v, u, **kw)
        if getattr(u, "requires_grad", False):
            o = o + 0.1 * (u - u.detach()).sum(-1, keepdim=True).to(o.dtype)
        return o, state


@needs_torch
@pytest.mark.parametrize(
    ("planted", "red_gate"), [(WrongForward, "validate_"), (WrongGradient, "grad_")]
)
def test_a_red_gate_stops_the_timing(tmp_path, planted, red_gate):
    timer = CountingTimer()
    run = run_suite("torch", kernels={"torch_chunked": planted()}, timer=timer, **TINY)
    red = [key for key, gate in run.correctness.items() if gate["passed"] is False]
    assert len(red) == 1 and red[0].startswith(red_gate), run.correctness
    assert not run.passed
    assert timer.calls == 0 and run.records == []
    data = json.loads(write_outputs(run, tmp_path)["json"].read_text())
    assert data["records"] == [] and not (tmp_path / "torch.png").exists()


def test_fitted_exponents_recover_a_power_law():
    records = [
        Record("op", 1, T, 16, 64, "bfloat16", "fwd", 0.01 * T**1.5) for T in (1024, 4096, 16384)
    ]
    records.append(Record("op", 1, 1024, 16, 64, "bfloat16", "fwdbwd", 1.0))  # one point: no fit
    assert fitted_exponents(records) == {("op", "fwd", 64): pytest.approx(1.5)}


@needs_torch
def test_the_chunk_suite_needs_its_backend(capsys):
    from vla_verify.cli import main

    status = {b.name: b for b in backends.available()}["triton_chunked"]
    if status.available:
        pytest.skip("triton_chunked is available here")
    assert main(["bench", "--suite", "chunk", "--cpu"]) == 2
    assert "triton_chunked" in capsys.readouterr().err


@pytest.mark.skipif(not STORED.is_file(), reason="not a source checkout")
def test_c9_reads_the_package_copy_of_the_stored_results():
    rows, source = c9_kernel_speed.load_rows()
    assert source == "vla_verify/data/h200_fused.json (NVIDIA H200)"
    assert rows == json.loads(STORED.read_text())["records"]
    chunk_rows, chunk_source = c9_kernel_speed.load_rows(
        packaged_name=c9_kernel_speed.CROSSOVER_RESULTS
    )
    assert chunk_source == "vla_verify/data/chunk.json (NVIDIA H200)"
    assert chunk_rows == json.loads(STORED_CHUNK.read_text())["records"]


@needs_torch
def test_the_overhead_suite_times_the_registry_call_against_the_direct_call(monkeypatch):
    pytest.importorskip("triton")
    import torch

    from vla_verify import bench
    from vla_verify.backends import triton_fused

    calls: list[str] = []

    def direct(q, k, v, u, **kw):
        calls.append("direct")
        return q, None

    def registry(name):
        def call(q, k, v, u, **kw):
            calls.append(f"registry {name}")
            return q, None

        return call

    monkeypatch.setattr(triton_fused, "fused_recurrent_vla", direct)
    monkeypatch.setattr(backends, "get", registry)
    x = bench._inputs(1, 4, 1, 4, torch.float32, "cpu")
    table = bench.make_ops(x, ops=SUITES["overhead"].ops)
    table["registry_triton_fused", "fwd"]()
    table["direct_triton_fused", "fwd"]()
    assert calls == ["registry triton_fused", "direct"]


@needs_torch
def test_run_py_wraps_the_cli(tmp_path):
    import importlib.util as util

    spec = util.spec_from_file_location("bench_run", ROOT / "benchmarks/gpu/run.py")
    assert spec is not None and spec.loader is not None
    run_py = util.module_from_spec(spec)
    spec.loader.exec_module(run_py)
    argv = ["--suite", "torch", "--cpu", "--T", "8", "--D", "4", "--H", "1", "--quiet"]
    assert run_py.main([*argv, "--out", str(tmp_path), "--no-plot"]) == 0
    data = json.loads((tmp_path / "torch.json").read_text())
    assert data["suite"] == "torch" and data["records"]


@pytest.mark.skipif(not STORED.is_file(), reason="not a source checkout")
def test_replot_draws_a_stored_result(tmp_path):
    pytest.importorskip("matplotlib")
    from vla_verify.bench import replot

    assert replot(STORED, tmp_path) == 0
    assert (tmp_path / "fused.png").stat().st_size > 10_000
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"machine": {}, "records": [], "correctness": {}}))
    assert replot(empty, tmp_path) == 2


def test_autotune_cache_keeps_only_the_results(tmp_path, monkeypatch):
    """``benchmarks/gpu/autotune_cache.py``: ``save`` copies Triton's ``<key>/<kernel>
    .autotune.json`` files out of the cache (not its compiled kernels), ``restore`` puts them
    back under the same keys, without overwriting the cache's own, also through one ``.tar``
    archive; a missing folder is refused."""
    import importlib.util as util

    spec = util.spec_from_file_location("autotune_cache", ROOT / "benchmarks/gpu/autotune_cache.py")
    assert spec is not None and spec.loader is not None
    tool = util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    cache = tmp_path / "cache"
    for key, name in (("ab12", "chunk_fwd_kernel"), ("cd34", "solve_tril")):
        (cache / key).mkdir(parents=True)
        (cache / key / f"{name}.autotune.json").write_text(json.dumps({"key": name}))
        (cache / key / f"{name}.cubin").write_bytes(b"\0" * 64)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    stored = tmp_path / "stored"
    assert tool.main(["save", str(stored)]) == 0
    kept = sorted(str(p.relative_to(stored)) for p in stored.rglob("*") if p.is_file())
    assert kept == ["ab12/chunk_fwd_kernel.autotune.json", "cd34/solve_tril.autotune.json"]
    fresh = tmp_path / "fresh"
    (fresh / "ab12").mkdir(parents=True)
    (fresh / "ab12" / "chunk_fwd_kernel.autotune.json").write_text("own")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(fresh))
    assert tool.main(["restore", str(stored)]) == 0
    assert (fresh / "ab12" / "chunk_fwd_kernel.autotune.json").read_text() == "own"
    assert json.loads((fresh / "cd34" / "solve_tril.autotune.json").read_text()) == {
        "key": "solve_tril"
    }
    assert tool.main(["restore", str(tmp_path / "absent")]) == 2
    # The same through one archive.
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    archive = tmp_path / "results.tar"
    assert tool.main(["save", str(archive)]) == 0
    import tarfile

    assert archive.is_file() and tarfile.is_tarfile(archive)
    other = tmp_path / "other"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(other))
    assert tool.main(["restore", str(archive)]) == 0
    got = sorted(str(p.relative_to(other)) for p in other.rglob("*") if p.is_file())
    assert got == kept
