"""``benchmarks/gpu/kernel_counters.py`` without a GPU: the ``ncu`` command it builds and the
summary it reads from ``ncu``'s CSV (a details page written by hand in ``ncu``'s layout)."""

from __future__ import annotations

import csv
import importlib.util
import io
from pathlib import Path

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "kernel_counters.py"
_spec = importlib.util.spec_from_file_location("kernel_counters", _PATH)
assert _spec is not None and _spec.loader is not None
counters = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(counters)

_COLUMNS = ("ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream",
            "Block Size", "Grid Size", "Device", "CC", "Section Name", "Metric Name",
            "Metric Unit", "Metric Value")  # fmt: skip
_SCAN = ("0", "1", "python3", "h", "vla_penalty_bwd_scan_kernel", "1", "7", "(256, 1, 1)",
         "(1, 16, 1)", "0", "9.0")  # fmt: skip
_PREP = ("1", "1", "python3", "h", "state_prep_kernel", "1", "7", "(128, 1, 1)", "(256, 16, 1)",
         "0", "9.0")  # fmt: skip
_ROWS = (
    (*_SCAN, "GPU Speed Of Light Throughput", "Duration", "us", "5,800.12"),
    (*_SCAN, "Occupancy", "Achieved Occupancy", "%", "12.5"),
    (*_PREP, "Launch Statistics", "Registers Per Thread", "register/thread", "255"),
    (*_PREP, "Launch Statistics", "Cache Configuration", "", "CachePreferNone"),
)


def _details() -> str:
    """A details page as ``ncu --csv`` writes it, between its own messages."""
    buf = io.StringIO()
    csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows((_COLUMNS, *_ROWS))
    return "==PROF== Connected to process 1\n" + buf.getvalue() + "==PROF== Disconnected\n"


def test_summary_reads_every_launch_and_metric(tmp_path: Path) -> None:
    path = tmp_path / "ncu.csv"
    path.write_text(_details())
    got = counters.summarise(path)
    assert [r["kernel"] for r in got] == ["vla_penalty_bwd_scan_kernel", "state_prep_kernel"]
    scan, prep = got
    assert scan["grid"] == "(1, 16, 1)" and scan["block"] == "(256, 1, 1)"
    assert scan["metrics"] == {"Duration (us)": 5800.12, "Achieved Occupancy (%)": 12.5}
    assert prep["metrics"]["Registers Per Thread (register/thread)"] == 255.0
    assert prep["metrics"]["Cache Configuration"] == "CachePreferNone"


def test_command_profiles_one_step_with_the_clocks_left_alone(tmp_path: Path) -> None:
    cmd = counters.ncu_command("ncu", tmp_path / "x.csv", 64, 4096, extra=True)
    assert cmd[:5] == ["ncu", "--clock-control", "none", "--profile-from-start", "off"]
    assert cmd[-3:] == ["--child", "64", "4096"]
    assert cmd.count("--section") == len(counters.SECTIONS)
    metrics = cmd[cmd.index("--metrics") + 1].split(",")
    assert "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum" in metrics
    assert "--metrics" not in counters.ncu_command("ncu", tmp_path / "x.csv", 64, 4096, False)
