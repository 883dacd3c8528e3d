"""The entry point :func:`vla_verify.ops.vla`: which kernel it picks, what it passes on, and
that one real call (the chunked kernel under Triton's interpreter) is the recurrence."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from vla_verify import VLAConfig, ops
from vla_verify.errors import VLAInputError

torch = pytest.importorskip("torch")


class _Recorder:
    def __init__(self, name: str) -> None:
        self.name = name
        self.calls: list[dict] = []

    def __call__(self, q, k, v, u, **kwargs):  # type: ignore[no-untyped-def]
        self.calls.append({"T": q.shape[1], **kwargs})
        return self.name, kwargs


@pytest.fixture()
def kernels(monkeypatch: pytest.MonkeyPatch) -> dict[str, _Recorder]:
    rec = {"chunked": _Recorder("chunked"), "recurrent": _Recorder("recurrent")}
    monkeypatch.setattr(ops, "_KERNELS", dict(rec))
    return rec


def _x(T: int, grad: bool = False) -> torch.Tensor:
    return torch.ones(1, T, 1, 4, requires_grad=grad)


def test_short_sequences_and_decoding_run_the_recurrent_kernel(kernels) -> None:
    crossovers = [t for t in ops.FORWARD_CROSSOVER_T.values() if t is not None]
    last = min(crossovers, default=4097) - 1
    for T in (1, 16, last):
        name, _ = ops.vla(_x(T), _x(T), _x(T), _x(T))
        assert name == "recurrent", T


def test_without_a_measured_crossover_every_forward_is_recurrent(kernels, monkeypatch) -> None:
    monkeypatch.setattr(ops, "FORWARD_CROSSOVER_T", {64: None, 128: None})
    for T in (1, 64, 70000):
        assert ops.choose(T, training=False) == "recurrent"
        assert ops.choose(T, training=False, dk=100) == "recurrent"


@pytest.mark.parametrize("training", [False, True], ids=["forward", "training"])
def test_the_measured_crossovers_pick_the_chunked_kernel_for_long_sequences(training) -> None:
    """Each width's row (``ops`` cites the runs): from its length on
    the chunked kernel, below it the recurrent one; a row of ``None``, the recurrent one at
    every length; a width between rows takes the wider row."""
    table = ops.TRAINING_CROSSOVER_T if training else ops.FORWARD_CROSSOVER_T
    assert set(table) == {64, 128}
    for width, T in table.items():
        if T is None:
            assert all(ops.choose(n, training, dk=width) == "recurrent" for n in (1, 10**6))
            continue
        assert ops.choose(T, training, dk=width) == "chunked"
        assert ops.choose(T - 1, training, dk=width) == "recurrent"
    if table[64] is not None and table[64] != table[128]:
        # The narrow row's length, below the wide row's (or with none): the two choose apart.
        assert ops.choose(table[64], training, dk=64) != ops.choose(table[64], training, dk=65)


def test_keys_wider_than_every_row_run_the_recurrent_kernel(kernels, monkeypatch) -> None:
    monkeypatch.setattr(ops, "FORWARD_CROSSOVER_T", {2: 64})
    assert ops.vla(_x(64), _x(64), _x(64), _x(64))[0] == "recurrent"  # dk = 4 > 2
    monkeypatch.setattr(ops, "FORWARD_CROSSOVER_T", {4: 64})
    assert ops.vla(_x(64), _x(64), _x(64), _x(64))[0] == "chunked"


def test_a_width_between_rows_takes_the_wider_row(monkeypatch) -> None:
    monkeypatch.setattr(ops, "FORWARD_CROSSOVER_T", {64: 4096, 128: 8192})
    assert ops.choose(4096, False, dk=64) == "chunked"
    assert ops.choose(4096, False, dk=65) == "recurrent"
    assert ops.choose(8192, False, dk=65) == "chunked"


def test_long_prefill_runs_the_chunked_kernel(kernels, monkeypatch) -> None:
    monkeypatch.setattr(ops, "FORWARD_CROSSOVER_T", {64: 64})  # the rule, whatever the measurement
    T = 64
    name, kwargs = ops.vla(_x(T), _x(T), _x(T), _x(T), config=VLAConfig.exact(), start=40)
    assert name == "chunked"
    assert kwargs == {"config": VLAConfig.exact(), "initial_state": None, "start": 40}


def test_training_follows_the_training_crossover(kernels, monkeypatch) -> None:
    monkeypatch.setattr(ops, "FORWARD_CROSSOVER_T", {64: 64})
    monkeypatch.setattr(ops, "TRAINING_CROSSOVER_T", {64: None})
    name, _ = ops.vla(_x(64, grad=True), _x(64), _x(64), _x(64))
    assert name == "recurrent"
    monkeypatch.setattr(ops, "TRAINING_CROSSOVER_T", {64: 8})
    name, _ = ops.vla(_x(8), _x(8), _x(8, grad=True), _x(8))
    assert name == "chunked"


def test_start_reaches_the_recurrent_kernel(kernels) -> None:
    ops.vla(_x(3), _x(3), _x(3), _x(3), start=7)
    assert kernels["recurrent"].calls[-1]["start"] == 7


def test_kernel_can_be_forced_and_a_bad_name_is_refused(kernels) -> None:
    assert ops.vla(_x(2), _x(2), _x(2), _x(2), kernel="chunked")[0] == "chunked"
    with pytest.raises(VLAInputError) as info:
        ops.vla(_x(2), _x(2), _x(2), _x(2), kernel="fastest")
    assert info.value.argument == "kernel"


class _Graph:
    """A stand-in for a CUDA graph: a replay reruns the captured call on the captured inputs
    and writes the captured outputs in place, as a graph does."""

    def __init__(self, fn, inputs, outputs) -> None:  # type: ignore[no-untyped-def]
        self.fn, self.inputs, self.outputs = fn, inputs, outputs
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1
        for mine, new in zip(self.outputs, self.fn(*self.inputs), strict=True):
            mine.copy_(new)


def _stand_in_capture(log: list[str]):  # type: ignore[no-untyped-def]
    def capture(fn, tensors):  # type: ignore[no-untyped-def]
        log.append("capture")
        inputs = [x.clone() for x in tensors]
        outputs = fn(*inputs)
        return ops._Replay(_Graph(fn, inputs, outputs), inputs, outputs)

    return capture


def _graph_call(log: list[str]):  # type: ignore[no-untyped-def]
    def fn(a, b):  # type: ignore[no-untyped-def]
        log.append("eager")
        return [a * 2 + b, a.sum().reshape(1)]

    return fn


def test_a_signature_is_captured_on_its_second_call_and_replayed_on_new_inputs() -> None:
    """The first call runs eagerly, the second captures and replays, the third replays alone;
    every result is the eager call's on that call's inputs (a cache that replayed without
    copying the new inputs in would return the first call's), and the returned tensors are
    copies that a later replay does not overwrite."""
    log: list[str] = []
    cache = ops._GraphCache(_stand_in_capture(log))
    fn = _graph_call(log)
    results = []
    for i in range(3):
        a, b = torch.full((3,), float(i + 1)), torch.arange(3.0) * (i + 1)
        got = cache("sig", fn, [a, b], list)
        want = [a * 2 + b, a.sum().reshape(1)]
        assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True)), i
        results.append((got, want))
        assert log.count("capture") == (0 if i == 0 else 1)
    assert log[0] == "eager" and log[1] == "capture"
    assert cache.graphs["sig"].graph.replays == 2  # type: ignore[union-attr]
    for got, want in results:  # earlier results untouched by later replays
        assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def test_the_graph_cache_keeps_the_most_recently_used_signatures(monkeypatch) -> None:
    monkeypatch.setattr(ops, "GRAPH_CAPACITY", 2)
    log: list[str] = []
    cache = ops._GraphCache(_stand_in_capture(log))
    fn = _graph_call(log)
    x = [torch.ones(2), torch.ones(2)]
    for key in ("a", "a", "b", "b", "a", "c", "c"):
        cache(key, fn, x, list)
    assert list(cache.graphs) == ["a", "c"]  # "b" was the least recently used
    assert log.count("capture") == 3


def test_a_failed_capture_runs_the_signature_eagerly() -> None:
    log: list[str] = []
    cache = ops._GraphCache(lambda fn, tensors: log.append("capture"))  # returns None
    fn = _graph_call(log)
    a, b = torch.ones(2), torch.zeros(2)
    for _ in range(4):
        got = cache("sig", fn, [a, b], list)
        assert torch.equal(got[0], a * 2 + b)
    assert log.count("capture") == 1 and log.count("eager") == 4


class _CudaLike:
    """Shape, ``requires_grad`` and ``is_cuda`` of a CUDA tensor: what :func:`ops.vla` reads to
    route a call."""

    def __init__(self, T: int, grad: bool = False, dk: int = 4) -> None:
        self.shape, self.requires_grad, self.is_cuda = (1, T, 1, dk), grad, True


def test_only_inference_calls_of_the_chunked_kernel_up_to_the_bound_go_through_graphs(
    kernels, monkeypatch
) -> None:
    routed: list[int] = []
    monkeypatch.setattr(ops, "_graphed", lambda fn, q, *a: routed.append(q.shape[1]) or "graphed")
    monkeypatch.setattr(ops, "GRAPH_MAX_TOKEN_HEADS", {4: 64})
    x = _CudaLike
    assert ops.vla(x(64), x(64), x(64), x(64), kernel="chunked") == "graphed"
    assert ops.vla(x(65), x(65), x(65), x(65), kernel="chunked")[0] == "chunked"  # too long
    wide = [_CudaLike(8, dk=8) for _ in range(4)]
    assert ops.vla(*wide, kernel="chunked")[0] == "chunked"  # no row for dk = 8
    state = (x(8), x(8), x(8))
    assert ops.vla(x(8), x(8), x(8), x(8), kernel="chunked", initial_state=state)[0] == "chunked"
    assert ops.vla(x(8), x(8), x(8), x(8), kernel="chunked", graphs=False)[0] == "chunked"
    assert ops.vla(x(8), x(8, True), x(8), x(8), kernel="chunked")[0] == "chunked"  # training
    assert ops.vla(x(8), x(8), x(8), x(8), kernel="recurrent")[0] == "recurrent"
    assert ops.vla(_x(8), _x(8), _x(8), _x(8), kernel="chunked")[0] == "chunked"  # on the CPU
    assert routed == [64]


def test_import_vla_verify_ops_does_not_import_torch_or_triton() -> None:
    code = "import sys, vla_verify.ops; print('torch' in sys.modules, 'triton' in sys.modules)"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root
    )
    assert out.stdout.split() == ["False", "False"]


@pytest.mark.triton
def test_the_chunked_kernel_through_the_entry_point_is_the_recurrence() -> None:
    """One real call under the interpreter (a subprocess: TRITON_INTERPRET must be set before
    Triton is imported), against the float64 oracle."""
    pytest.importorskip("triton")
    code = """
import numpy as np, torch
from vla_verify import VLAConfig, ops
from vla_verify.backends.numpy_oracle import recurrence
from vla_verify.error_model import compare
rng = np.random.default_rng(0)
x = [np.exp(0.5 * rng.standard_normal((1, 40, 1, 8))) for _ in range(3)]
u = rng.standard_normal((1, 40, 1, 8)) / 8
cfg = VLAConfig(nudge_period=20, nudge_eta=0.5)
o, _ = ops.vla(*[torch.tensor(a, dtype=torch.float32) for a in (*x, u)], config=cfg,
               start=3, kernel="chunked")
seen = [torch.tensor(a, dtype=torch.float32).double().numpy() for a in (*x, u)]
ref = recurrence(*seen, config=cfg, start=3)
base = recurrence(*seen, config=cfg, start=3, dtype="float32")
print(compare("o", o.double().numpy(), ref.o, base.o, "float32", terms=8 + 64).ratio)
"""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True, cwd=root
    )
    ratio = float(out.stdout.split()[-1])  # error / spec §4 budget (the chunked floor, C = 64)
    assert np.isfinite(ratio) and ratio <= 1.0


def _grid_script():
    """``benchmarks/gpu/chunk_h200.py`` as a module."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "chunk_h200.py"
    spec = importlib.util.spec_from_file_location("chunk_h200", path)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_a_cut_grid_resumes_from_its_complete_rows() -> None:
    """``chunk_h200.py --resume``: a grid cut during a row keeps its correctness (where all of it
    ran) and every row whose ops were all timed; the cut row is dropped, to be timed again whole
    (its ops side by side), and the grid's timing skips exactly the kept rows.  Another
    machine's records keep their machine, the new one beside it; another commit is refused."""
    script = _grid_script()
    ops = ("vla_triton_chunked", "sdpa")
    done = [{"op": op, "D": 64, "T": 1024, "mode": "fwd", "median_ms": 1.0} for op in ops]
    cut = [{"op": "vla_triton_chunked", "D": 64, "T": 4096, "mode": "fwd", "median_ms": 2.0}]
    machine = {"gpu": "NVIDIA H100 80GB HBM3", "commit": "abc"}
    previous = {"machine": machine, "records": done + cut, "correctness": {"grad": {"ok": 1}},
                "correctness_seconds": 90.0}  # fmt: skip
    with pytest.raises(SystemExit, match="one commit"):
        script.resumed(previous, {**machine, "commit": "def"})
    out = script.resumed(previous, dict(machine))
    assert out["records"] == done and out["correctness"] == previous["correctness"]
    assert "machine_resumed" not in out
    assert script._timed(out["records"], 64, 1024, "fwd")
    assert not script._timed(out["records"], 64, 4096, "fwd")
    assert not script._timed(out["records"], 64, 1024, "fwdbwd")
    # Cut during the correctness steps (no seconds written): they run again.
    partial = {k: v for k, v in previous.items() if k != "correctness_seconds"}
    assert script.resumed(partial, dict(machine))["correctness"] == {}
    other = script.resumed(previous, {"gpu": "NVIDIA H200", "commit": "abc"})
    assert other["machine"] == machine and other["machine_resumed"]["gpu"] == "NVIDIA H200"


def test_the_measured_crossover_reaches_a_known_answer(tmp_path) -> None:
    """``benchmarks/gpu/chunk_h200.py`` computes the crossover T (for C9 and for
    ``FORWARD_CROSSOVER_T``) from medians: on a linear op against a quadratic one that meet at
    T = 10⁴ it finds 10⁴ and the exponents 1 and 2; an op never faster has no crossover."""
    script = _grid_script()
    Ts = (1024, 4096, 16384, 65536)
    linear = {T: 1e-3 * T for T in Ts}
    quadratic = {T: 1e-7 * T * T for T in Ts}
    assert script._crossing(linear, quadratic) == pytest.approx(1e4)
    # Faster at the short lengths only: no crossover (the old rule gave the first T faster).
    assert script._crossing(quadratic, linear) is None
    assert script._crossing({T: 0.5 * v for T, v in linear.items()}, linear) == 1024.0
    assert script._crossing({T: 2 * v for T, v in quadratic.items()}, quadratic) is None
    # Faster, slower, then faster from the crossing between 4096 and 16384 on.
    wobbly = {1024: 1.0, 4096: 4.0, 16384: 1.0, 65536: 1.0}
    assert script._crossing(wobbly, {T: 2.0 for T in Ts}) == pytest.approx(8192.0)
    records = [
        {"op": op, "D": 64, "mode": "fwd", "T": T, "median_ms": series[T]}
        for op, series in (("vla_triton_chunked", linear), ("sdpa", quadratic))
        for T in Ts
    ]
    out = {"records": records}
    script.analyse(out, tmp_path / "chunk.json")
    assert out["analysis"]["exponents"] == {"vla_triton_chunked_D64_fwd": 1.0, "sdpa_D64_fwd": 2.0}
    assert out["analysis"]["crossovers"]["fwd_D64_chunked_beats_sdpa_from_T"] == pytest.approx(1e4)
