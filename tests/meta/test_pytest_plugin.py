"""The pytest plugin and ``conformance_test`` (vla_verify.testing): an inner pytest session on a
small kernel repository fails on a planted bug, with the shrunk counterexample and its replay
line, and passes on the oracle.

The inner session loads the plugin with ``-p vla_verify.pytest_plugin`` explicitly and without
entry points: the ``pytest11`` entry point only exists where the package is installed.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

KERNEL = '''
"""A small kernel repository's kernels: the recurrence, and a chunked copy that reloads its
penalty state A = I/lambda0 at every chunk of 8 tokens instead of carrying it."""
import numpy as np

from vla_verify import backends

_oracle = backends.get("numpy")


def recurrent_vla(q, k, v, u, *, config, initial_state=None, start=0):
    return _oracle(q, k, v, u, config=config, initial_state=initial_state, start=start)


def chunked_vla_buggy(q, k, v, u, *, config, initial_state=None, start=0):
    B, T, H, dk = q.shape
    outputs, state = [], initial_state
    for lo in range(0, T, 8):
        if lo > 0:
            S, A, z = state
            state = (S, np.broadcast_to(np.eye(dk) / config.lambda0, A.shape).copy(), z)
        part = [x[:, lo : lo + 8] for x in (q, k, v, u)]
        o, state = recurrent_vla(*part, config=config, initial_state=state, start=start + lo)
        outputs.append(o)
    return np.concatenate(outputs, axis=1), state
'''

TESTS = """
from vla_verify.testing import conformance_test
from mykernels.recurrent import chunked_vla_buggy, recurrent_vla

SMALL = dict(max_dk=8, max_T=40, max_batch=2)
test_recurrent = conformance_test(recurrent_vla, dtype="float64", chunk_size=8, **SMALL)
test_chunked_buggy = conformance_test(chunked_vla_buggy, dtype="float64", chunk_size=8, **SMALL)
"""


def test_conformance_test_fails_on_a_planted_bug_and_passes_on_the_oracle(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Entry points off: where the package is installed its pytest11 entry point would register
    # the same module a second time next to the explicit -p.
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.mkpydir("mykernels")
    pytester.path.joinpath("mykernels", "recurrent.py").write_text(KERNEL)
    pytester.makepyfile(test_kernels=TESTS)
    pytester.syspathinsert()
    result = pytester.runpytest_inprocess(
        "-p",
        "vla_verify.pytest_plugin",
        "--vla-profile",
        "quick",
        "-p",
        "no:cacheprovider",
        f"--vla-failure-dir={pytester.path / 'failures'}",
    )
    result.assert_outcomes(passed=1, failed=1)
    text = result.stdout.str()
    assert "vla_verify conformance: profile=quick" in text
    assert "FAILED test_kernels.py::test_chunked_buggy" in text
    # The failure message is the shrunk counterexample and its replay line.
    assert "input: B=1 T=9 H=1" in text, text
    assert "replay: vla-verify check mykernels.recurrent:chunked_vla_buggy --replay" in text
    assert list((pytester.path / "failures").glob("*.npz"))
