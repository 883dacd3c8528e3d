"""The claims ledger (vla_verify.proofs.ledger) and the ``claims`` / ``run`` commands."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest

from vla_verify import cli
from vla_verify.errors import VLAInputError
from vla_verify.proofs import ledger
from vla_verify.proofs.ledger import ClaimResult, Verdict


def test_verdict_constructors():
    assert Verdict.from_search(0) is Verdict.HOLDS
    assert Verdict.from_search(2) is Verdict.FAILS
    assert Verdict.from_search(2, condition_separates=True) is Verdict.HOLDS_ONLY_IF
    assert Verdict.from_measurement(True) is Verdict.REPRODUCED
    assert Verdict.from_measurement(False) is Verdict.NOT_REPRODUCED
    assert Verdict.from_measurement(None) is Verdict.NOT_MEASURED
    assert Verdict.from_results([Verdict.HOLDS, Verdict.FAILS]) is Verdict.FAILS
    with pytest.raises(VLAInputError, match="violations"):
        Verdict.from_search(-1)


def test_holds_only_if_needs_a_condition():
    with pytest.raises(VLAInputError, match="condition"):
        ClaimResult("C9", "t", "s", "f", "m", Verdict.from_search(1, condition_separates=True))


def test_registry_has_every_claim():
    assert [c.id for c in ledger.all_claims()] == [f"C{i}" for i in range(1, 11)]


def test_claims_command_writes_the_json_schema(tmp_path, capsys):
    out = tmp_path / "ledger.json"
    md = tmp_path / "ledger.md"
    code = cli.main(
        [
            "claims",
            "--only",
            "C8,C9,C10",
            "--quiet",
            "--outdir",
            str(tmp_path / "r"),
            "--json",
            str(out),
            "--markdown",
            str(md),
            "--no-plots",
        ]
    )
    assert code == 0
    data = json.loads(out.read_text())
    ids = [c["id"] for c in data["claims"]]
    assert ids == [
        "C8.per_token",
        "C8.ratio",
        "C8.total",
        "C9.speedup",
        "C9.scaling",
        "C9.crossover",
        "C10",
        "C10.length",
    ]
    allowed = {v.value for v in Verdict}
    for c in data["claims"]:
        assert c["verdict"] in allowed
        assert c["condition"] is None or isinstance(c["condition"], str)
        assert isinstance(c["figures"], dict)
        assert c["counterexample"] is None or isinstance(c["counterexample"], str)
    printed = capsys.readouterr().out
    for c in data["claims"]:  # the table prints every claim with the verdict the JSON holds
        assert any(line.split()[:2] == [c["id"], c["verdict"]] for line in printed.splitlines()), (
            c["id"],
            c["verdict"],
            printed,
        )
    assert "# Claims ledger" in md.read_text()


def test_unknown_claim_is_a_usage_error(tmp_path, capsys):
    assert cli.main(["claims", "--only", "C42", "--quiet", "--outdir", str(tmp_path)]) == 2
    assert "--only" in capsys.readouterr().err


def test_run_from_cli_returns_json_data(tmp_path, monkeypatch):
    subset = [c for c in ledger.all_claims() if c.id in ("C9", "C10")]
    monkeypatch.setattr(ledger, "all_claims", lambda: subset)
    args = argparse.Namespace(profile="quick", outdir=str(tmp_path), quiet=True, seed=0, json=None)
    data = ledger.run_from_cli(args)
    json.dumps(data)
    assert [c["id"] for c in data["claims"]][-2:] == ["C10", "C10.length"]


def test_replay_of_a_certified_counterexample(tmp_path, capsys):
    from vla_verify.proofs.claims import c3_closed_form
    from vla_verify.proofs.ledger import PROFILES, Context

    ctx = Context(
        PROFILES["quick"].__class__(**{**PROFILES["quick"].__dict__, "examples": 5}), tmp_path
    )
    result = c3_closed_form.run_variant(ctx, "vla")
    assert result.verdict is Verdict.FAILS and result.certified
    assert cli.main(["claims", "--replay", result.counterexample]) == 0
    out = capsys.readouterr().out
    assert "still fails: yes" in out and "certified" in out
    assert cli.main(["claims", "--replay", str(tmp_path / "missing.json")]) == 2


@pytest.mark.slow
def test_quick_profile_runs_every_claim(tmp_path):
    pytest.importorskip("torch")  # the adversary engine of C4 and C5
    report = ledger.run_claims("quick", tmp_path, progress=False)
    ids = {r.id for r in report.results}
    expected = {"C1.float64", "C1.float32", "C1.bfloat16", "C1.float16", "C2", "C3.vla"}
    expected |= {"C3.rls", "C4.step", "C4.product", "C5.paper", "C5.exact", "C6.absolute"}
    expected |= {"C6.ratio", "C6.trained.absolute", "C6.trained.ratio", "C7.exact.tolerance"}
    expected |= {"C7.graceful.nearest", "C7.mqar.exact", "C7.mqar.graceful", "C10", "C10.length"}
    assert expected <= ids
    assert report.seconds < 300
    for r in report.results:
        if r.verdict is Verdict.FAILS and r.counterexample:
            # Every counterexample reproduces; the longest C5 one leaves its interval check to
            # --replay in the quick profile.
            assert r.certified or (r.id.startswith("C5") and r.certified is None)


def test_a_claim_whose_optional_package_is_missing_is_not_measured(tmp_path, monkeypatch):
    """Without torch the adversary engine cannot run: C4 is NOT_MEASURED with the install hint,
    and the other claims still run; any other import error propagates."""

    def needs_torch(ctx):
        raise ModuleNotFoundError("No module named 'torch'", name="torch")

    claims = ledger.all_claims()

    def with_c4(run):
        return lambda: [dataclasses.replace(c, run=run) if c.id == "C4" else c for c in claims]

    monkeypatch.setattr(ledger, "all_claims", with_c4(needs_torch))
    report = ledger.run_claims("quick", tmp_path, progress=False, only=["C4", "C8"], plots=False)
    by_id = {r.id: r for r in report.results}
    assert by_id["C4"].verdict is Verdict.NOT_MEASURED
    assert "pip install 'vla-verify[torch]'" in by_id["C4"].evidence[0]
    assert any(
        r.id.startswith("C8") and r.verdict is not Verdict.NOT_MEASURED for r in report.results
    )

    def needs_something_else(ctx):
        raise ModuleNotFoundError("No module named 'nonexistent'", name="nonexistent")

    monkeypatch.setattr(ledger, "all_claims", with_c4(needs_something_else))
    with pytest.raises(ModuleNotFoundError):
        ledger.run_claims("quick", tmp_path, progress=False, only=["C4"], plots=False)
