"""The nudge clock continues across calls (spec §2.3): a sequence cut anywhere and continued
from the returned state with ``start`` = the tokens consumed equals the whole sequence."""

from __future__ import annotations

import numpy as np
import pytest

from vla_verify import backends
from vla_verify.errors import ConfigError, UnsupportedConfigurationError
from vla_verify.spec import VLAConfig

CONFIG = VLAConfig(nudge_period=3, nudge_eta=0.05)


def _inputs(T: int = 11, dk: int = 3, dv: int = 2) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(7)
    q, k, u = (rng.standard_normal((1, T, 2, dk)) for _ in range(3))
    v = rng.standard_normal((1, T, 2, dv))
    return np.abs(q), np.abs(k), v, u / np.sqrt(dk)


def _decode(fn, q, k, v, u, cuts, convert=lambda x: x, back=np.asarray):  # type: ignore[no-untyped-def]
    """Run ``fn`` piecewise over the cut points, carrying the state and the clock."""
    outs, state, begin = [], None, 0
    for end in [*cuts, q.shape[1]]:
        part = [convert(x[:, begin:end]) for x in (q, k, v, u)]
        o, state = fn(*part, config=CONFIG, initial_state=state, start=begin)
        outs.append(back(o))
        begin = end
    return np.concatenate(outs, axis=1), tuple(back(x) for x in state)


@pytest.mark.parametrize("name", ["numpy", "mpmath"])
def test_token_by_token_equals_the_whole_sequence(name: str) -> None:
    fn = backends.get(name)
    q, k, v, u = _inputs()
    whole_o, whole_state = fn(q, k, v, u, config=CONFIG)
    o, state = _decode(fn, q, k, v, u, cuts=list(range(1, q.shape[1])))
    np.testing.assert_allclose(o, whole_o, rtol=1e-12, atol=1e-12)
    for a, b in zip(state, whole_state, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_torch_decodes_token_by_token() -> None:
    torch = pytest.importorskip("torch")
    fn = backends.get("torch")
    q, k, v, u = _inputs()
    whole_o, _ = backends.get("numpy")(q, k, v, u, config=CONFIG)
    o, _ = _decode(fn, q, k, v, u, list(range(1, q.shape[1])), torch.from_numpy, np.asarray)
    np.testing.assert_allclose(o, whole_o, rtol=1e-12, atol=1e-12)


def test_restarting_the_clock_is_caught() -> None:
    """Meta-test: decoding with ``start=0`` in every call (the clock restarted) differs."""
    fn = backends.get("numpy")
    q, k, v, u = _inputs()
    whole_o, _ = fn(q, k, v, u, config=CONFIG)
    restarted = lambda *a, start, **kw: fn(*a, start=0, **kw)  # noqa: E731
    o, _ = _decode(restarted, q, k, v, u, cuts=list(range(1, q.shape[1])))
    assert np.max(np.abs(o - whole_o)) > 1e-6


@pytest.mark.parametrize("start", [-1, 1.5, True, "3"])
def test_bad_start_is_a_typed_error(start: object) -> None:
    q, k, v, u = _inputs(T=2)
    with pytest.raises(ConfigError, match="start"):
        backends.get("numpy")(q, k, v, u, config=CONFIG, start=start)


def test_kernels_without_a_clock_refuse_a_shifted_start() -> None:
    from vla_verify.backends.registry import refuse_shifted_clock

    refuse_shifted_clock("x", CONFIG, 6)  # whole periods: nothing changes
    refuse_shifted_clock("x", VLAConfig.exact(), 5)  # no nudges
    with pytest.raises(UnsupportedConfigurationError, match="start"):
        refuse_shifted_clock("x", CONFIG, 4)
