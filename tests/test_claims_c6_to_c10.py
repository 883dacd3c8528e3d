"""Meta-tests of the measured claims C6–C9 (spec §3; C10: tests/test_claims_c10.py)."""

from __future__ import annotations

import json

import pytest
from claims_support import tiny_context

from vla_verify.proofs.claims import (
    c6_state_norm_figure,
    c7_capacity,
    c8_cost,
    c9_kernel_speed,
)
from vla_verify.proofs.ledger import Verdict


def test_c6_verdicts_follow_the_measurement(tmp_path):
    results = {r.id: r for r in c6_state_norm_figure.run(tiny_context(tmp_path))}
    absolute, ratio = results["C6.absolute"], results["C6.ratio"]
    f = absolute.figures
    assert f["reduction"] == pytest.approx(f["linear_norm"] / f["vla_norm"])
    # The verdicts are the rules applied to the figures, whatever the figures are.
    within = c6_state_norm_figure.LINEAR_FACTOR
    linear_ok = 1600 / within <= f["linear_norm"] <= 1600 * within
    assert (absolute.verdict is Verdict.REPRODUCED) == (linear_ok and f["vla_norm"] < 15)
    factor = c6_state_norm_figure.RATIO_FACTOR
    assert (ratio.verdict is Verdict.REPRODUCED) == (109 / factor <= f["reduction"] <= 109 * factor)
    assert f["zero_mean_reduction"] == pytest.approx(
        f["zero_mean_linear_norm"] / f["zero_mean_vla_norm"]
    )
    # Both norms are linear in the values: scaling W_v moves vla across 15, not the ratio.
    scaled = {r.id: r for r in c6_state_norm_figure.run(tiny_context(tmp_path), value_scale=0.45)}
    assert scaled["C6.absolute"].figures["vla_norm"] == pytest.approx(
        0.45 * f["vla_norm"], rel=0.05
    )
    assert scaled["C6.ratio"].figures["reduction"] == pytest.approx(f["reduction"], rel=0.05)
    assert scaled["C6.absolute"].verdict is not absolute.verdict


def test_c7_verdict_per_criterion(tmp_path):
    results = {r.id: r for r in c7_capacity.run(tiny_context(tmp_path))}
    assert set(results) == {
        f"C7.{kind}.{c}" for kind in ("exact", "graceful") for c in c7_capacity.CRITERIA
    } | {"C7.mqar.exact", "C7.mqar.graceful"}
    for c in c7_capacity.CRITERIA:
        exact = results[f"C7.exact.{c}"]
        assert (exact.verdict is Verdict.REPRODUCED) == (exact.figures["min_recall_n_le_dk"] == 1)
        graceful = results[f"C7.graceful.{c}"].figures
        assert (results[f"C7.graceful.{c}"].verdict is Verdict.REPRODUCED) == (
            graceful["vla_mean_recall_beyond_dk"] > graceful["linear_mean_recall_beyond_dk"]
        )
    # The criteria are nested: exact-to-tolerance implies cosine > 0.9 implies, for unit values,
    # a nearest-value hit unless two stored values are nearly parallel.
    assert (
        results["C7.exact.tolerance"].figures["min_recall_n_le_dk"]
        <= results["C7.exact.cosine"].figures["min_recall_n_le_dk"]
    )
    ortho = {
        r.id: r
        for r in c7_capacity.run(tiny_context(tmp_path), subject="delta", keys="orthonormal")
    }
    assert ortho["C7.exact.tolerance"].verdict is Verdict.REPRODUCED  # projections, exactly


def test_c8_formula_equals_instrumented_count():
    for d in (4, 16, 32):
        for variant in ("vla", "linear", "delta"):
            assert c8_cost.counted_flops(variant, d, T=20) == c8_cost.formula_flops(variant, d)


def test_c8_verdicts_change_with_the_algorithm(tmp_path):
    vla = {r.id: r for r in c8_cost.run(tiny_context(tmp_path))}
    assert vla["C8.per_token"].verdict is Verdict.HOLDS
    assert vla["C8.total"].verdict is Verdict.HOLDS
    assert vla["C8.ratio"].verdict is Verdict.NOT_REPRODUCED
    assert abs(vla["C8.ratio"].figures["ratio_at_128"] - 3.25) < 0.05
    rls = {r.id: r for r in c8_cost.run(tiny_context(tmp_path), subject="rls")}
    assert rls["C8.ratio"].verdict is Verdict.REPRODUCED
    refit = {r.id: r for r in c8_cost.run(tiny_context(tmp_path), subject="refit")}
    assert refit["C8.total"].verdict is Verdict.FAILS
    assert refit["C8.per_token"].verdict is Verdict.FAILS  # its solve is a d×d matrix product


def test_c8_naive_inverse_is_cubic():
    flops = [c8_cost.counted_flops("naive", d) for d in (8, 16)]
    assert 6 < flops[1] / flops[0] < 9


def test_c9_not_measured_without_results_and_computed_with_them(tmp_path):
    missing = c9_kernel_speed.run(tiny_context(tmp_path), path=tmp_path / "absent.json")
    assert {r.verdict for r in missing} == {Verdict.NOT_MEASURED}
    assert "not yet measured" in missing[0].evidence[0]
    rows = []

    def record(op: str, T: int, ms: float) -> dict:
        return {
            "op": op,
            "B": 1,
            "T": T,
            "H": 16,
            "D": 64,
            "dtype": "bfloat16",
            "mode": "fwd",
            "median_ms": ms,
        }

    for T in (1024, 8192, 32768, 65536):  # the crossing at 50000 lies in (32768, 65536]
        rows += [
            record("vla_triton_fused", T, T * 1e-3),
            record("vla_torch_sequential", T, T * 14e-3),
            record("sdpa", T, T * T * 2e-8),
        ]
    path = tmp_path / "fused.json"
    path.write_text(json.dumps({"machine": {}, "records": rows}))
    good = {r.id: r for r in c9_kernel_speed.run(tiny_context(tmp_path), path=path)}
    assert good["C9.speedup"].verdict is Verdict.REPRODUCED
    assert good["C9.scaling"].verdict is Verdict.REPRODUCED
    assert good["C9.crossover"].verdict is Verdict.REPRODUCED
    for r in rows:
        if r["op"] == "vla_triton_fused":
            r["median_ms"] = r["T"] ** 2 * 1e-6
    path.write_text(json.dumps({"machine": {}, "records": rows}))
    bad = {r.id: r for r in c9_kernel_speed.run(tiny_context(tmp_path), path=path)}
    assert bad["C9.scaling"].verdict is Verdict.NOT_REPRODUCED
    for r in rows:  # a sequential loop only 3x slower than the kernel: no 14x speed-up
        if r["op"] == "vla_torch_sequential":
            r["median_ms"] = 3 * r["T"] ** 2 * 1e-6
    path.write_text(json.dumps({"machine": {}, "records": rows}))
    slow = {r.id: r for r in c9_kernel_speed.run(tiny_context(tmp_path), path=path)}
    assert slow["C9.speedup"].verdict is Verdict.NOT_REPRODUCED


@pytest.mark.parametrize(
    ("Ts", "crossing", "verdict"),
    [
        ((16384, 32768, 65536), 50000, Verdict.REPRODUCED),  # (32768, 65536] inside
        ((4096, 16384, 65536), 50000, Verdict.NOT_MEASURED),  # (16384, 65536] across 21500
        ((1024, 4096, 8192), 3000, Verdict.NOT_REPRODUCED),  # (1024, 4096] below the window
        ((16384, 65536, 131072), 200000, Verdict.NOT_REPRODUCED),  # slower at 131072 > 86000
        ((16384, 65536), 200000, Verdict.NOT_MEASURED),  # slower up to 65536: longer decide
        ((65536, 131072), 100000, Verdict.NOT_MEASURED),  # (65536, 131072] across 86000
    ],
)  # fmt: skip
def test_c9_crossover_verdict_reads_the_bracket(tmp_path, Ts, crossing, verdict):
    """Known answers: the crossing at ``crossing`` (VLA ∝ T, softmax ∝ T², equal there), the
    verdict from the bracket the measured lengths put around it; a first faster length inside
    the window is not enough when the length before it lies outside."""
    rows = [{"op": "sdpa", "T": T, "D": 64, "mode": "fwd", "median_ms": T * T * 1e-8}
            for T in Ts]  # fmt: skip
    rows += [{"op": "vla_triton_chunked", "T": T, "D": 64, "mode": "fwd",
              "median_ms": T * crossing * 1e-8} for T in Ts]  # fmt: skip
    path = tmp_path / "chunk.json"
    path.write_text(json.dumps({"machine": {}, "records": rows}))
    ctx = tiny_context(tmp_path)
    got = {r.id: r for r in c9_kernel_speed.run(ctx, crossover_path=path)}["C9.crossover"]
    assert got.verdict is verdict, got.evidence


def test_c9_crossover_takes_the_faster_vla_kernel_of_one_run(tmp_path):
    """The crossover meets softmax with the faster of the recurrent and chunked kernels, both
    timed beside SDPA in the one file it reads."""

    def record(op: str, T: int, ms: float) -> dict:
        return {"op": op, "B": 1, "T": T, "H": 16, "D": 64, "dtype": "bfloat16", "mode": "fwd",
                "median_ms": ms}  # fmt: skip

    Ts = (4096, 16384, 32768, 65536, 98304)
    rows = [record("sdpa", T, T * T * 1e-8) for T in Ts]
    rows += [record("vla_triton_fused", T, T * 1e-3) for T in Ts]  # beats SDPA from T = 100000
    path = tmp_path / "chunk.json"
    path.write_text(json.dumps({"machine": {}, "records": rows}))
    ctx = tiny_context(tmp_path)
    alone = {r.id: r for r in c9_kernel_speed.run(ctx, crossover_path=path)}["C9.crossover"]
    assert alone.verdict is Verdict.NOT_REPRODUCED and alone.figures["crossover_T"] is None
    assert alone.figures["extrapolated_crossover_T"] == pytest.approx(1e5, rel=1e-9)
    rows += [record("vla_triton_chunked", T, T * 4e-4) for T in Ts]  # beats SDPA from 40000
    path.write_text(json.dumps({"machine": {}, "records": rows}))
    both = {r.id: r for r in c9_kernel_speed.run(ctx, crossover_path=path)}["C9.crossover"]
    assert both.figures["crossover_T"] == 65536 and both.verdict is Verdict.REPRODUCED
    assert both.figures["crossover_bracket"] == [32768, 65536]
    assert both.figures["fastest_vla_kernel"][65536] == "vla_triton_chunked"
    assert both.method == f"read {path}"
    # The speed-up and the exponent still come from the package's recurrent grid.
    speedup = {r.id: r for r in c9_kernel_speed.run(ctx, crossover_path=path)}["C9.speedup"]
    assert speedup.method == "read vla_verify/data/h200_fused.json (NVIDIA H200)"
