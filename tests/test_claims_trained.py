"""Meta-tests of the verdicts read from the trained models (spec §3 C6, C7, C10): ``C10.length``,
``C6.trained.*`` and ``C7.mqar.*`` on planted result files, each flipped both ways — figures that
agree give REPRODUCED, one planted disagreeing cell gives NOT_REPRODUCED, a cell short of seeds
gives NOT_MEASURED naming it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from claims_support import tiny_context

from vla_verify.experiments.results import MIN_SEEDS
from vla_verify.proofs.claims import c6_state_norm_figure, c7_capacity, c10_recall
from vla_verify.proofs.ledger import Verdict


def _plant(
    results: Path,
    grid: str,
    task: dict[str, int],
    mixer: str,
    accuracies: list[float],
    *,
    norms: list[float] | None = None,
) -> None:
    """One cell's job files as the runner writes them (the fields the aggregation reads): one
    file per seed, with the trained probe's ``||S_t||_F`` at t = 1000 when ``norms`` is given."""
    folder = results / grid
    folder.mkdir(parents=True, exist_ok=True)
    name = "-".join(f"{k}{v}" for k, v in sorted(task.items()))
    for seed, accuracy in enumerate(accuracies):
        job = {"grid": grid, "task": "mqar", "task_params": task, "mixer": mixer, "seed": seed,
               "lr": 1e-3, "model": {}, "train": {}, "probe_T": 0}  # fmt: skip
        data: dict = {"job": job, "val_accuracy": accuracy, "test_accuracy": accuracy}
        if norms is not None:
            data["probe_trained"] = {"t": [1, 1000], "layers": [{"mean": [0.0, norms[seed]]}]}
        (folder / f"{grid}-{name}-{mixer}-s{seed}.json").write_text(json.dumps(data))


def _drop_seed(results: Path, grid: str, mixer: str, task_part: str, seed: int = 2) -> None:
    (path,) = results.glob(f"{grid}/{grid}-*{task_part}*-{mixer}-s{seed}.json")
    path.unlink()


def _seeds(value: float) -> list[float]:
    return [value] * MIN_SEEDS


# -- C10.length ------------------------------------------------------------------------------


def _plant_c10(results: Path) -> None:
    """The seven C10 figures and the length sweep, every cell at the paper's figure."""
    for mixer, paper in (("vla", 1.0), ("deltanet", 0.01), ("linear", 0.074), ("softmax", 0.26)):
        _plant(results, "mqar", {"n_pairs": 24, "seq_len": 256}, mixer, _seeds(paper))
    _plant(results, "mqar", {"n_pairs": 32, "seq_len": 256}, "vla", _seeds(0.62))
    for T in c10_recall.LENGTHS:
        for mixer, paper in c10_recall.LENGTH_PAPER.items():
            _plant(results, "mqar_length", {"n_pairs": 8, "seq_len": T}, mixer, _seeds(paper))


def _c10(results: Path, tmp_path: Path) -> dict:
    return {r.id: r for r in c10_recall.run(tiny_context(tmp_path), path=results)}


def test_c10_length_reproduced_when_every_cell_agrees(tmp_path):
    results = tmp_path / "results"
    _plant_c10(results)
    out = _c10(results, tmp_path)
    assert out["C10"].verdict is Verdict.REPRODUCED
    length = out["C10.length"]
    assert length.verdict is Verdict.REPRODUCED
    assert len(length.figures["table"]) == 2 * len(c10_recall.LENGTHS)
    assert length.figures["worst_deviation"] == pytest.approx(0.0)
    assert any("T = 64 deltanet: measured 0.010 ± 0.000 (3 seeds), paper 0.010" in e
               for e in length.evidence)  # fmt: skip


def test_c10_length_one_disagreeing_cell_is_not_reproduced(tmp_path):
    results = tmp_path / "results"
    _plant_c10(results)
    # DeltaNet recalls everything at T = 128: outside the seven figures, so only C10.length sees it.
    _plant(results, "mqar_length", {"n_pairs": 8, "seq_len": 128}, "deltanet", _seeds(1.0))
    out = _c10(results, tmp_path)
    assert out["C10"].verdict is Verdict.REPRODUCED
    assert out["C10.length"].verdict is Verdict.NOT_REPRODUCED
    assert "T = 128 deltanet" in out["C10.length"].evidence[0]
    assert out["C10.length"].figures["worst_deviation"] == pytest.approx(0.99)


def test_c10_length_missing_seeds_are_not_measured_and_named(tmp_path):
    results = tmp_path / "results"
    _plant_c10(results)
    _drop_seed(results, "mqar_length", "vla", "seq_len256")
    out = _c10(results, tmp_path)
    length = out["C10.length"]
    assert length.verdict is Verdict.NOT_MEASURED
    assert length.figures["missing"] == [f"T = 256 vla (2 of {MIN_SEEDS} seeds)"]
    # A cell measured on its seeds that disagrees decides, whatever the other cells lack.
    _plant(results, "mqar_length", {"n_pairs": 8, "seq_len": 64}, "vla", _seeds(0.5))
    assert _c10(results, tmp_path)["C10.length"].verdict is Verdict.NOT_REPRODUCED


def test_c10_length_reads_the_cells_of_a_summary(tmp_path):
    results = tmp_path / "results"
    _plant_c10(results)
    from vla_verify.experiments.results import summary

    path = tmp_path / "summary.json"
    path.write_text(json.dumps(summary(results)))
    out = _c10(path, tmp_path)
    assert out["C10"].verdict is out["C10.length"].verdict is Verdict.REPRODUCED


# -- C6.trained ------------------------------------------------------------------------------


def _plant_norms(results: Path, linear: list[float], vla: list[float], delta: list[float]) -> None:
    task = {"n_pairs": 24, "seq_len": 256}
    for mixer, norms in (("linear", linear), ("vla", vla), ("deltanet", delta)):
        _plant(results, "mqar", task, mixer, [0.5] * len(norms), norms=norms)


@pytest.mark.parametrize(
    ("vla", "absolute", "ratio"),
    [
        (10.0, Verdict.REPRODUCED, Verdict.REPRODUCED),  # 1600 and 10: ratio 160
        (20.0, Verdict.NOT_REPRODUCED, Verdict.REPRODUCED),  # not below 15; ratio 80
        (5.0, Verdict.REPRODUCED, Verdict.NOT_REPRODUCED),  # ratio 320, beyond ×2 of 109
    ],
)
def test_c6_trained_rules_follow_the_planted_probes(tmp_path, vla, absolute, ratio):
    results = tmp_path / "results"
    _plant_norms(results, _seeds(1600.0), _seeds(vla), _seeds(3.0))
    out = {r.id: r for r in c6_state_norm_figure.trained_results(results)}
    assert out["C6.trained.absolute"].verdict is absolute
    assert out["C6.trained.ratio"].verdict is ratio
    figures = out["C6.trained.ratio"].figures
    assert figures["reduction"] == pytest.approx(1600.0 / vla)
    assert figures["deltanet_norm"] == pytest.approx(3.0)  # reported beside


def test_c6_trained_linear_far_from_the_paper_is_not_reproduced(tmp_path):
    results = tmp_path / "results"
    _plant_norms(results, _seeds(4000.0), _seeds(30.0), _seeds(3.0))  # 4000 > 2·1600
    out = {r.id: r for r in c6_state_norm_figure.trained_results(results)}
    assert out["C6.trained.absolute"].verdict is Verdict.NOT_REPRODUCED
    assert out["C6.trained.ratio"].verdict is Verdict.REPRODUCED  # 133×


def test_c6_trained_without_seeds_or_results_is_not_measured(tmp_path):
    results = tmp_path / "results"
    _plant_norms(results, _seeds(1600.0), [10.0, 10.0], _seeds(3.0))
    out = c6_state_norm_figure.trained_results(results)
    assert {r.verdict for r in out} == {Verdict.NOT_MEASURED}
    assert out[0].figures["missing"] == [f"vla (2 of {MIN_SEEDS} probe values)"]
    assert "vla (2 of 3 probe values)" in out[0].evidence[0]
    empty = c6_state_norm_figure.trained_results(tmp_path / "absent")
    assert {r.verdict for r in empty} == {Verdict.NOT_MEASURED}


def test_c6_run_returns_the_trained_verdicts_beside_the_random_layer(tmp_path):
    results = tmp_path / "results"
    _plant_norms(results, _seeds(1600.0), _seeds(10.0), _seeds(3.0))
    out = {r.id: r for r in c6_state_norm_figure.run(tiny_context(tmp_path), path=results)}
    assert set(out) == {"C6.absolute", "C6.ratio", "C6.trained.absolute", "C6.trained.ratio"}
    assert out["C6.trained.absolute"].verdict is Verdict.REPRODUCED
    assert out["C6.trained.absolute"].method == f"read {results}"


def test_trained_verdicts_read_the_repository_folder_not_the_working_directory(
    tmp_path, monkeypatch
):
    results = tmp_path / "results"
    _plant_norms(results, _seeds(1600.0), _seeds(10.0), _seeds(3.0))
    monkeypatch.setattr(c10_recall, "_default_sources", lambda: [results])
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "experiments" / "results").mkdir(parents=True)  # an empty decoy
    monkeypatch.chdir(elsewhere)
    out = c6_state_norm_figure.trained_results()
    assert out[0].verdict is Verdict.REPRODUCED
    assert out[0].method == "read experiments/results"  # named relative to the repository


# -- C7.mqar ---------------------------------------------------------------------------------


def _plant_capacity(results: Path) -> None:
    """The capacity grid: VLA exact up to d_h and well above linear attention beyond it."""
    for n in c7_capacity.MQAR_N:
        # The real grid widens the vocabulary at n = 64; the cell is still found by n and T.
        task = {"n_pairs": n, "seq_len": 256, **({"vocab": 256} if n == 64 else {})}
        _plant(results, "mqar", task, "vla", _seeds(1.0) if n <= 32 else [0.8, 0.85, 0.9])
        _plant(results, "mqar", task, "linear", [0.10, 0.12, 0.14])
        _plant(results, "mqar", task, "deltanet", _seeds(1.0))
        _plant(results, "mqar", task, "softmax", _seeds(1.0))


def _c7(results: Path) -> dict:
    return {r.id: r for r in c7_capacity.mqar_results(results)}


def test_c7_mqar_reproduced_when_every_cell_agrees(tmp_path):
    results = tmp_path / "results"
    _plant_capacity(results)
    out = _c7(results)
    assert out["C7.mqar.exact"].verdict is Verdict.REPRODUCED
    assert out["C7.mqar.exact"].figures["min_vla_accuracy_n_le_dk"] == pytest.approx(1.0)
    assert out["C7.mqar.graceful"].verdict is Verdict.REPRODUCED
    assert set(out["C7.mqar.graceful"].figures["margins"]) == {48, 64}
    assert "softmax 1.000 ± 0.000 (3 seeds)" in out["C7.mqar.graceful"].evidence[1]


def test_c7_mqar_exact_one_disagreeing_cell_is_not_reproduced(tmp_path):
    results = tmp_path / "results"
    _plant_capacity(results)
    _plant(results, "mqar", {"n_pairs": 16, "seq_len": 256}, "vla", _seeds(0.9))
    out = _c7(results)
    assert out["C7.mqar.exact"].verdict is Verdict.NOT_REPRODUCED
    assert "n = 16 vla" in out["C7.mqar.exact"].evidence[0]
    assert out["C7.mqar.graceful"].verdict is Verdict.REPRODUCED


def test_c7_mqar_graceful_needs_a_difference_beyond_two_standard_errors(tmp_path):
    results = tmp_path / "results"
    _plant_capacity(results)
    # Mean 0.667 against 0.12, but one seed of three fails: 0.547 < 2·sqrt(0.333² + 0.012²).
    task = {"n_pairs": 64, "seq_len": 256, "vocab": 256}
    _plant(results, "mqar", task, "vla", [0.0, 1.0, 1.0])
    out = _c7(results)
    assert out["C7.mqar.graceful"].verdict is Verdict.NOT_REPRODUCED
    assert out["C7.mqar.graceful"].figures["min_difference_in_se"] < 2
    assert out["C7.mqar.exact"].verdict is Verdict.REPRODUCED


def test_c7_mqar_missing_seeds_are_not_measured_and_named(tmp_path):
    results = tmp_path / "results"
    _plant_capacity(results)
    _drop_seed(results, "mqar", "vla", "n_pairs8-")
    _drop_seed(results, "mqar", "deltanet", "n_pairs8-")  # beside the verdict: named apart
    for seed in range(MIN_SEEDS):
        _drop_seed(results, "mqar", "linear", "n_pairs48-", seed)
    out = _c7(results)
    exact, graceful = out["C7.mqar.exact"], out["C7.mqar.graceful"]
    assert exact.verdict is Verdict.NOT_MEASURED
    assert exact.figures["missing"] == [f"n = 8 vla (2 of {MIN_SEEDS} seeds)"]
    assert exact.figures["missing_beside"] == [f"n = 8 deltanet (2 of {MIN_SEEDS} seeds)"]
    assert graceful.verdict is Verdict.NOT_MEASURED
    assert graceful.figures["missing"] == [f"n = 48 linear (0 of {MIN_SEEDS} seeds)"]
    # A judged disagreement decides even while another cell lacks seeds.
    _plant(results, "mqar", {"n_pairs": 64, "seq_len": 256, "vocab": 256}, "vla", _seeds(0.1))
    assert _c7(results)["C7.mqar.graceful"].verdict is Verdict.NOT_REPRODUCED


def test_c7_run_returns_the_mqar_verdicts_and_no_results_are_not_measured(tmp_path):
    out = {r.id: r for r in c7_capacity.run(tiny_context(tmp_path), path=tmp_path / "absent")}
    assert out["C7.mqar.exact"].verdict is Verdict.NOT_MEASURED
    assert out["C7.mqar.graceful"].verdict is Verdict.NOT_MEASURED
    assert len(out["C7.mqar.exact"].figures["missing"]) == 5  # n = 4, 8, 16, 24, 32


def test_the_trained_verdicts_need_no_torch():
    """The ledger reads the training results with NumPy and JSON only."""
    code = (
        "import sys\n"
        "from vla_verify.proofs.claims import c6_state_norm_figure, c7_capacity, c10_recall\n"
        "c6_state_norm_figure.trained_results(); c7_capacity.mqar_results()\n"
        "c10_recall.length_result(c10_recall.load_cells(c10_recall.results_location(None)[0]), "
        "c10_recall.RESULTS)\n"
        "assert 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
