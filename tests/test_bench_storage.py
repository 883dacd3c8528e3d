"""The GPU benchmarks' baselines are stored per card (``benchmarks/conftest.py``): the folder
name of a device, and the committed baselines sitting where a run on their card looks."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_PATH = ROOT / "benchmarks" / "conftest.py"
_spec = importlib.util.spec_from_file_location("bench_conftest", _PATH)
assert _spec is not None and _spec.loader is not None
bench_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_conftest)


@pytest.mark.parametrize(
    "name, slug",
    [
        ("NVIDIA H200", "h200"),
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H100 NVL", "h100-nvl"),
        ("NVIDIA A100-SXM4-80GB", "a100-sxm4"),
        ("NVIDIA H200 141GB HBM3e", "h200"),
    ],
)
def test_slug_of_keeps_the_card_and_its_form_factor(name: str, slug: str) -> None:
    assert bench_conftest.slug_of(name) == slug


def test_every_stored_baseline_is_in_its_cards_folder() -> None:
    """A baseline stored under ``results/<folder>/pytest-benchmark/`` was measured on a card
    whose folder is ``<folder>``, so ``--benchmark-compare`` on that card finds it (a file
    under another card's folder would be compared with the wrong card, or never)."""
    stored = sorted((ROOT / "benchmarks" / "results").glob("*/pytest-benchmark/*/*.json"))
    assert stored, "no stored pytest-benchmark baselines"
    for path in stored:
        folder = path.relative_to(ROOT / "benchmarks" / "results").parts[0]
        gpu = json.loads(path.read_text())["machine_info"]["gpu"]["gpu"]
        assert bench_conftest.slug_of(gpu) == folder, (path, gpu)
