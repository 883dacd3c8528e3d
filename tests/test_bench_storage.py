"""The GPU benchmarks' baselines are stored per card (``benchmarks/conftest.py``): the folder
name of a device, and the committed baselines sitting where a run on their card looks.  (The
benchmarks' conftest is not imported here: it unsets ``TRITON_INTERPRET``, which the kernel
tests of the same process need.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vla_verify.bench import card_folder

ROOT = Path(__file__).resolve().parents[1]


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
def test_card_folder_keeps_the_card_and_its_form_factor(name: str, slug: str) -> None:
    assert card_folder(name) == slug


def test_every_stored_baseline_is_in_its_cards_folder() -> None:
    """A baseline stored under ``results/<folder>/pytest-benchmark/`` was measured on a card
    whose folder is ``<folder>``, so ``--benchmark-compare`` on that card finds it (a file
    under another card's folder would be compared with the wrong card, or never)."""
    stored = sorted((ROOT / "benchmarks" / "results").glob("*/pytest-benchmark/*/*.json"))
    assert stored, "no stored pytest-benchmark baselines"
    for path in stored:
        folder = path.relative_to(ROOT / "benchmarks" / "results").parts[0]
        gpu = json.loads(path.read_text())["machine_info"]["gpu"]["gpu"]
        assert card_folder(gpu) == folder, (path, gpu)
