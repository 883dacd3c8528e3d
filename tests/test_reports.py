"""Reports of the ledger (vla_verify.reports): table, JSON, Markdown, plots, matplotlib optional."""

from __future__ import annotations

import builtins
import json
import subprocess
import sys

import pytest

from vla_verify import reports
from vla_verify.proofs.ledger import ClaimResult, LedgerReport, Verdict


def _report(tmp_path) -> LedgerReport:
    results = [
        ClaimResult(
            "C1",
            "SM",
            "s",
            "f",
            "m",
            Verdict.from_search(0),
            figures={"err": 1e-15},
            key_figure="err",
            series={"sm_drift": {"T": [1, 10], "float32": [1e-7, 2e-7]}},
        ),
        ClaimResult(
            "C4.step",
            "J",
            "s",
            "f",
            "m",
            Verdict.from_search(3, condition_separates=True),
            condition="α̂ ∥ k̂",
            counterexample=str(tmp_path / "c.json"),
            certified=True,
            series={"jacobian_norms": {4: [1.0, 1.2, 1.3]}},
        ),
        ClaimResult(
            "C5",
            "B",
            "s",
            "f",
            "m",
            Verdict.from_search(1),
            series={
                "state_norms_random": {"vla": [1.0, 2.0]},
                "state_norms_adversarial": {"linear": [1.0, 3.0]},
            },
        ),
    ]
    return LedgerReport("quick", 0, results, 1.0, str(tmp_path))


def test_table_markdown_json(tmp_path):
    report = _report(tmp_path)
    reports.write_all(report, tmp_path, plots=False)
    table = reports.terminal_table(report)
    assert "HOLDS_ONLY_IF" in table and "only if: α̂ ∥ k̂" in table and "certified" in table
    md = (tmp_path / "claims.md").read_text()
    assert "| C4.step | **HOLDS_ONLY_IF** | α̂ ∥ k̂ |" in md
    data = json.loads((tmp_path / "claims.json").read_text())
    ids = [c["id"] for c in data["claims"]]
    assert ids == ["C1", "C4.step", "C5"]
    for c in data["claims"]:
        assert {"id", "verdict", "condition", "figures", "counterexample"} <= set(c)


def test_plots_are_written(tmp_path):
    pytest.importorskip("matplotlib")
    files = reports.write_all(_report(tmp_path), tmp_path, plots=True)
    for name in ("state_norms", "jacobian_norms", "sm_drift"):
        assert (tmp_path / f"{name}.png").stat().st_size > 1000, files


def _texts(fig):
    """Every piece of text a reader sees on a figure: titles, axis labels, legend entries."""
    out = [fig._suptitle.get_text()] if fig._suptitle is not None else []
    for ax in fig.axes:
        out += [ax.get_title(), ax.get_xlabel(), ax.get_ylabel()]
        legend = ax.get_legend()
        out += [t.get_text() for t in legend.get_texts()] if legend is not None else []
    return [t for t in out if t]


def test_plots_are_labelled_in_words(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    drawn = reports.figures(_report(tmp_path))
    assert set(drawn) == {"state_norms", "jacobian_norms", "sm_drift"}
    for name, fig in drawn.items():
        for ax in fig.axes:
            assert ax.get_title() and ax.get_legend() is not None, name
            for label in (ax.get_xlabel(), ax.get_ylabel()):
                assert len(label.split()) >= 3, (name, label)  # words, not a symbol
        texts = _texts(fig)
        assert not [t for t in texts if reports.raw_tex(t)], (name, texts)
        # The variant and dtype keys of the series are spelled out in the legends.
        assert not {"vla", "float32"} & set(texts), (name, texts)
        plt.close(fig)
    assert any("(tokens)" in t for t in _texts(drawn["sm_drift"]))


@pytest.mark.parametrize(
    ("text", "tex"),
    [
        ("$A_T$", True),
        ("a \\| b", True),
        ("M^{-1}", True),
        ("x_{t}", True),
        ("\\lambda", True),
        ("relative error of A (Frobenius norm, against M⁻¹)", False),
        ("sequence length T (tokens)", False),
    ],
)
def test_raw_tex_is_recognised(text, tex):
    assert reports.raw_tex(text) is tex


def test_plots_skipped_without_matplotlib(tmp_path, monkeypatch):
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError("no matplotlib")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    report = _report(tmp_path)
    files = reports.write_all(report, tmp_path)
    assert not any(f.endswith(".png") for f in files.values())
    assert any("matplotlib is not installed" in n for n in report.notes)


def test_import_vla_verify_does_not_import_matplotlib():
    code = (
        "import sys, vla_verify, vla_verify.reports, vla_verify.proofs.ledger; "
        "print('matplotlib' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_reports_import_nothing_of_the_proofs():
    """The ledger imports the reports; the reports never import the ledger (no cycle)."""
    import ast

    tree = ast.parse(open(reports.__file__, encoding="utf-8").read())
    imported = [
        node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
    ] + [
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    ]
    assert imported and not [m for m in imported if "proofs" in m], imported
