"""``benchmarks/gpu/state_side_precision.py`` under Triton's interpreter: its counterexample
step passes with the backend's state-side scheme and with float32 intermediates, and fails
with float16 intermediates planted (the check can fail), and its schemes leave the backend as
they found it."""

from __future__ import annotations

import json
from pathlib import Path

from script_support import interpreted_chunked_marks, load_script

pytestmark = interpreted_chunked_marks()
ssp = load_script("benchmarks/gpu/state_side_precision.py")

from vla_verify.backends import triton_chunked as tc  # noqa: E402


def test_the_counterexample_separates_the_schemes(tmp_path: Path) -> None:
    before = tc._state_dtype
    out = ssp.run(tmp_path / "out.json", device="cpu", seeds=[], examples=1, budget_s=1)
    assert out["conformance"] == {"backend": []}
    assert out["counterexample"]["backend"]["passed"]
    assert out["counterexample"]["float32"]["passed"]
    assert not out["counterexample"]["float16"]["passed"]
    assert out["counterexample"]["float16"]["ratio"] > 1
    assert tc._state_dtype == before
    assert (
        json.loads((tmp_path / "out.json").read_text())["counterexample"] == out["counterexample"]
    )
