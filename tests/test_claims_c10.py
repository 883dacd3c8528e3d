"""Meta-tests of C10's verdict rule (spec §3 C10): planted complete, wrong and partial results."""

from __future__ import annotations

import json

import pytest
from claims_support import tiny_context

from vla_verify.errors import VLAInputError
from vla_verify.experiments.results import C10_FIGURES, MIN_SEEDS
from vla_verify.proofs.claims import c10_recall
from vla_verify.proofs.ledger import Verdict


def _cell(mean: float, spread: float = 0.0) -> dict:
    values = [mean - spread, mean, mean + spread][:MIN_SEEDS]
    return {"mean": mean, "std": spread, "values": values, "seeds": list(range(len(values)))}


def _summary(tmp_path, figures: dict) -> object:
    path = tmp_path / "summary.json"
    path.write_text(json.dumps({"figures": figures}))
    return path


def _paper_figures(**changes: float) -> dict:
    return {
        name: _cell(changes.get(name.replace(".", "_"), paper))
        for name, paper in c10_recall.PAPER.items()
    }


def test_no_results_is_not_measured(tmp_path):
    absent, length = c10_recall.run(tiny_context(tmp_path), path=tmp_path / "absent")
    assert absent.verdict is Verdict.NOT_MEASURED
    assert "not yet measured" in absent.method
    assert length.id == "C10.length" and length.verdict is Verdict.NOT_MEASURED
    (tmp_path / "empty").mkdir()
    empty, _length = c10_recall.run(tiny_context(tmp_path), path=tmp_path / "empty")
    assert empty.verdict is Verdict.NOT_MEASURED
    other = tmp_path / "other" / "tiny"  # results of other grids only
    other.mkdir(parents=True)
    job = {
        "grid": "tiny",
        "task": "copy",
        "task_params": {"length": 6},
        "mixer": "vla",
        "seed": 0,
        "lr": 0.01,
        "model": {},
        "train": {},
        "probe_T": 0,
    }
    (other / "a.json").write_text(
        json.dumps({"job": job, "val_accuracy": 0.1, "test_accuracy": 0.1})
    )
    none, _length = c10_recall.run(tiny_context(tmp_path), path=tmp_path / "other")
    assert none.verdict is Verdict.NOT_MEASURED


def test_complete_results_meeting_the_figures_reproduce(tmp_path):
    path = _summary(tmp_path, _paper_figures(mqar_n24_softmax=0.30))  # within 0.05
    result, _length = c10_recall.run(tiny_context(tmp_path), path=path)
    assert result.verdict is Verdict.REPRODUCED
    assert result.figures["table"]["mqar_n24.softmax"]["measured"] == pytest.approx(0.30)
    assert result.figures["worst_deviation"] == pytest.approx(0.04)


@pytest.mark.parametrize(
    "change", [{"mqar_n24_vla": 0.5}, {"mqar_n24_softmax": 1.0}, {"n_eq_dk_vla": 0.9}]
)
def test_one_figure_off_is_not_reproduced(tmp_path, change):
    path = _summary(tmp_path, _paper_figures(**change))
    result, _length = c10_recall.run(tiny_context(tmp_path), path=path)
    assert result.verdict is Verdict.NOT_REPRODUCED


def test_the_spread_over_seeds_widens_the_tolerance_only_by_two_standard_errors():
    assert c10_recall.agrees(0.93, 0.0, 3, 1.0) is False
    assert c10_recall.agrees(0.93, 0.1, 3, 1.0) is True  # 0.05 + 2·0.1/√3 = 0.165
    assert c10_recall.agrees(0.80, 0.1, 3, 1.0) is False


def test_partial_results_are_an_error_naming_what_is_missing(tmp_path):
    only_one = {"mqar_n24.vla": _cell(1.0)}  # what the old rule accepted
    with pytest.raises(VLAInputError, match=r"fixed_n8\.deltanet") as info:
        c10_recall.run(tiny_context(tmp_path), path=_summary(tmp_path, only_one))
    assert "mqar_n24.softmax" in str(info.value) and "mqar_n24.vla" not in str(info.value)
    two_seeds = _paper_figures()
    two_seeds["n_eq_dk.vla"] = {"mean": 0.62, "std": 0.0, "values": [0.62, 0.62]}
    with pytest.raises(VLAInputError, match=r"n_eq_dk.vla \(2 of 3 seeds\)"):
        c10_recall.run(tiny_context(tmp_path), path=_summary(tmp_path, two_seeds))


def test_default_partial_results_are_not_measured_with_the_missing_list(tmp_path, monkeypatch):
    results = tmp_path / "results"
    _plant_jobs(results, {"mqar_n24.vla": 1.0})
    monkeypatch.setattr(c10_recall, "_default_sources", lambda: [results])
    result, _length = c10_recall.run(tiny_context(tmp_path))
    assert result.verdict is Verdict.NOT_MEASURED
    assert "mqar_n24.softmax (0 of 3 seeds)" in result.evidence[0]


def _plant_jobs(results, accuracies: dict, *, lr: float = 1e-3, val_shift: float = 0.0):
    """Job files as the runner writes them (only the fields the aggregation reads)."""
    for name, accuracy in accuracies.items():
        grid, params, mixer = C10_FIGURES[name]
        task = {"n_pairs": 24, "seq_len": 256, **params} if grid == "mqar" else dict(params)
        for seed in range(MIN_SEEDS):
            job = {
                "grid": grid,
                "task": "mqar",
                "task_params": task,
                "mixer": mixer,
                "seed": seed,
                "lr": lr,
                "model": {},
                "train": {},
                "probe_T": 0,
            }
            out = results / grid / f"{name}-lr{lr}-s{seed}.json"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(
                json.dumps(
                    {"job": job, "val_accuracy": accuracy + val_shift, "test_accuracy": accuracy}
                )
            )


def test_a_results_directory_is_aggregated_at_the_learning_rate_chosen_on_validation(tmp_path):
    results = tmp_path / "results"
    _plant_jobs(results, dict(c10_recall.PAPER))
    # a second learning rate, worse on validation but with perfect test scores: not selected
    _plant_jobs(results, {"mqar_n24.deltanet": 1.0}, lr=3e-3, val_shift=-0.995)
    result, _length = c10_recall.run(tiny_context(tmp_path), path=results)
    assert result.verdict is Verdict.REPRODUCED
    # the same second setting now better on validation: selected, and the figure is off
    _plant_jobs(results, {"mqar_n24.deltanet": 1.0}, lr=3e-3, val_shift=0.0)
    result, _length = c10_recall.run(tiny_context(tmp_path), path=results)
    assert result.verdict is Verdict.NOT_REPRODUCED
    assert result.figures["table"]["mqar_n24.deltanet"]["measured"] == pytest.approx(1.0)


def test_the_trained_state_norm_is_that_of_the_selected_setting():
    """C6's trained figure comes from the n = 24 jobs in the setting the cell selects on
    validation, the untrained one from the state_norm grid; other settings' probes are left
    out."""
    from vla_verify.experiments.results import c6_figures

    def probe(value: float) -> dict:
        return {"t": [1, 1000], "layers": [{"mean": [0.0, value], "heads": []}]}

    def result(grid: str, seed: int, model: dict, val: float, norm: float) -> dict:
        job = {"grid": grid, "task": "mqar", "task_params": {"n_pairs": 24, "seq_len": 256},
               "mixer": "vla", "seed": seed, "lr": 1e-3, "model": model, "train": {},
               "probe_T": 10_000}  # fmt: skip
        return {"job": job, "val_accuracy": val, "test_accuracy": val,
                "probe_untrained": probe(norm / 2), "probe_trained": probe(norm)}  # fmt: skip

    results = [result("mqar", s, {"short_conv": 4}, 0.99, 30.0 + s) for s in range(3)]
    results += [result("mqar", s, {}, 0.10, 500.0) for s in range(3)]  # loses on validation
    untrained = {"grid": "state_norm", "task": "mqar", "mixer": "vla", "seed": 0, "lr": 0.0,
                 "task_params": {}, "model": {}, "train": {}, "probe_T": 10_000}  # fmt: skip
    results.append({"job": untrained, "probe_untrained": probe(28.0)})
    figures = c6_figures(results)
    assert figures["trained"]["vla"]["values"] == [30.0, 31.0, 32.0]
    assert figures["untrained"]["vla"]["values"] == [28.0]
    results = [r for r in results if r["job"]["model"] != {"short_conv": 4}]
    assert c6_figures(results)["trained"]["vla"]["values"] == [500.0] * 3
