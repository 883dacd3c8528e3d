"""The ``vla-verify`` command line: exit codes, the counterexample print-out, the registry table."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from vla_verify.cli import main, parse_config
from vla_verify.errors import VLAInputError


@pytest.fixture()
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A kernel author's module in the current directory, with a good and a broken function."""
    tests_dir = Path(__file__).parent
    (tmp_path / "my_kernels.py").write_text(
        textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(tests_dir)!r})
        from mutants import make
        good = make(None)
        late_nudge = make("nudge_one_step_late")
        not_callable = 3
    """)
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_kernels"


def test_check_passes_with_exit_0(user_module: str, capsys: pytest.CaptureFixture) -> None:
    rc = main(["check", f"{user_module}:good", "--max-examples", "20", "--seed", "1", "--quiet"])
    out = capsys.readouterr().out
    assert rc == 0 and "PASSED" in out and "my_kernels:good" in out


def test_check_fails_with_exit_1_and_prints_the_counterexample(
    user_module: str, capsys: pytest.CaptureFixture
) -> None:
    rc = main(
        ["check", f"{user_module}:late_nudge", "--max-examples", "60", "--seed", "1", "--quiet"]
    )
    out = capsys.readouterr().out
    assert rc == 1
    assert "FAILED" in out and "shrunk by Hypothesis" in out
    assert "input: B=1 T=20 H=1" in out  # the shortest sequence with a nudge
    assert "got" in out and "expected" in out and "budget" in out


def test_check_respects_config_options(user_module: str, capsys: pytest.CaptureFixture) -> None:
    """Without nudges the late-nudge bug cannot show: the check passes."""
    rc = main(
        [
            "check",
            f"{user_module}:late_nudge",
            "--exact",
            "--max-examples",
            "30",
            "--seed",
            "1",
            "--quiet",
        ]
    )
    assert rc == 0, capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["check", "my_kernels"], "MODULE:FUNC: expected 'package.module:function'"),
        (["check", "no_such_module_xyz:f"], "cannot import 'no_such_module_xyz'"),
        (["check", "my_kernels:missing"], "has no attribute 'missing'"),
        (["check", "my_kernels:not_callable"], "is not callable"),
        (["check", "my_kernels:good", "--dtype", "bfloat16"], "array='numpy' supports"),
        (["check", "my_kernels:good", "--set", "lambda0=0"], "lambda0: expected a number > 0"),
        (["check", "my_kernels:good", "--set", "lamda0=1"], "--set: expected FIELD=VALUE"),
    ],
)
def test_usage_errors_exit_2(
    user_module: str, argv: list[str], message: str, capsys: pytest.CaptureFixture
) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_argparse_errors_exit_2(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as info:
        main(["check", "m:f", "--variant", "gla"])
    assert info.value.code == 2


def test_parse_config() -> None:
    c = parse_config(True, ["lambda0=1", "normalize_gate=false", "nudge_period=none"])
    assert c.lambda0 == 1.0 and not c.normalize_gate and c.nudge_period is None
    assert parse_config(False, ["nudge_period=5"]).nudge_period == 5
    with pytest.raises(VLAInputError):
        parse_config(False, ["nudge_period=x"])


def test_backends_table_and_json(capsys: pytest.CaptureFixture) -> None:
    assert main(["backends"]) == 0
    out = capsys.readouterr().out
    assert "numpy" in out and "mpmath" in out and "triton_fused" in out
    assert main(["backends", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["name"] for r in rows} >= {"numpy", "mpmath"}
    assert all(r["available"] == (r["reason"] is None) for r in rows)


def test_run_conformance_only(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "report.json"
    rc = main(
        [
            "run",
            "--backends",
            "numpy,mpmath",
            "--max-examples",
            "10",
            "--skip-claims",
            "--quiet",
            "--json",
            str(path),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0 and "Conformance" in out and "PASSED" in out
    report = json.loads(path.read_text())
    assert [r["verdict"] for r in report["conformance"]] == ["PASSED"] * 3


def test_console_script_is_installed() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "vla_verify", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for command in ("check", "backends", "run"):
        assert command in out


def test_run_takes_a_configuration_each_backend_supports() -> None:
    pytest.importorskip("torch")
    from vla_verify import VLAConfig, backends
    from vla_verify.conformance import run_config as _run_config

    config, note = _run_config(backends.get("numpy"), "float64", "cpu")
    assert config == VLAConfig() and note == ""
    config, note = _run_config(backends.get("torch_chunked", chunk_size=32), "float32", "cpu")
    assert config.nudge_period == 32 and "nudge_period=32" in note
