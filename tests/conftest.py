"""Test configuration: Hypothesis profiles, backend selection, and the Triton interpreter.

Profiles (``HYPOTHESIS_PROFILE``; default ``ci`` when ``$CI`` is set, else ``dev``):

- ``dev``: 50 examples, random;
- ``ci``: 25 examples, derandomised (the same examples every run), no deadline;
- ``thorough``: 1000 examples, the long searches.

Tests marked ``slow`` (a long interpreter run, the whole ledger) run under ``thorough`` or with
``--run-slow``; the other profiles skip them, so that the README's test command stays a CI run.

``VLA_VERIFY_BACKENDS=a,b`` picks the backends that the backend-parametrised tests run against
(default ``all``: every backend this machine can run); the choice is printed in the report
header.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
from hypothesis import HealthCheck, settings


def _cuda_visible() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


# Triton kernels run on CPU tensors through the interpreter when there is no GPU.  The variable
# must be set before triton is first imported, hence here.
if "TRITON_INTERPRET" not in os.environ and not _cuda_visible():
    os.environ["TRITON_INTERPRET"] = "1"
# The interpreter's reductions with a user combine function, folded by slices (bit-identical),
# and its bf16 conversions rounded to nearest as the GPU rounds them, as the command line runs
# them (vla_verify.runtime).
if os.environ.get("TRITON_INTERPRET") == "1":
    from vla_verify.runtime import fold_interpreter_reductions, round_interpreter_bf16_to_nearest

    fold_interpreter_reductions()
    round_interpreter_bf16_to_nearest()

_common = dict(
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("dev", max_examples=50, **_common)
settings.register_profile("ci", max_examples=25, derandomize=True, database=None, **_common)
settings.register_profile("thorough", max_examples=1000, **_common)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
settings.load_profile(PROFILE)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--run-slow",
        action="store_true",
        help="also run the tests marked slow (the thorough profile runs them anyway)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if PROFILE == "thorough" or config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="slow: runs with --run-slow or HYPOTHESIS_PROFILE=thorough")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def pytest_report_header(config: pytest.Config) -> list[str]:
    from vla_verify.backends import selected

    return [
        f"vla_verify: hypothesis profile={PROFILE}, backends={','.join(selected())}, "
        f"TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '')}"
    ]


@pytest.fixture(scope="session")
def hypothesis_profile() -> str:
    return PROFILE
