"""Meta-test of the registry's non-finite output check (Backend.__call__): a planted backend that
silently returns NaN from finite inputs must be reported, unless it opts out."""

from __future__ import annotations

import numpy as np
import pytest

from vla_verify.backends.registry import Backend, Capabilities
from vla_verify.errors import ConfigError, NonFiniteResultError


def _tiny():
    rng = np.random.default_rng(0)
    return tuple(rng.standard_normal((1, 3, 1, 2)) for _ in range(4))


class _PlantedNaN(Backend):
    """Plant: a backend that silently returns NaN."""

    name = "planted_nan"
    capabilities = Capabilities(array="numpy", devices=("cpu",), dtypes=("float64",))

    def _run(self, q, k, v, u, *, config, initial_state, start=0):  # type: ignore[no-untyped-def]
        B, T, H, dk = q.shape
        o = np.full((B, T, H, v.shape[-1]), np.nan)
        return o, (
            np.zeros((B, H, v.shape[-1], dk)),
            np.zeros((B, H, dk, dk)),
            np.zeros((B, H, dk)),
        )


def test_planted_backend_returning_nan_is_caught_unless_it_opts_out() -> None:
    with pytest.raises(NonFiniteResultError, match="non-finite o"):
        _PlantedNaN()(*_tiny())
    quiet = _PlantedNaN()
    quiet.finite_output_check = False  # the opt-out a GPU kernel may take
    o, _ = quiet(*_tiny())
    assert np.isnan(o).all()


class _NoPenaltyState(_PlantedNaN):
    """A backend that keeps no ``A`` (as fla's adapters): ``None`` is not a non-finite output."""

    def _run(self, q, k, v, u, *, config, initial_state, start=0):  # type: ignore[no-untyped-def]
        B, T, H, dk = q.shape
        dv = v.shape[-1]
        return np.zeros((B, T, H, dv)), (np.zeros((B, H, dv, dk)), None, np.zeros((B, H, dk)))


def test_a_state_entry_that_is_not_kept_passes_the_check() -> None:
    o, (_, A, _) = _NoPenaltyState()(*_tiny())
    assert A is None and np.all(o == 0)


def test_torch_chunked_checks_its_inputs_unless_told_not_to() -> None:
    """The option a training loop on a GPU turns off (a device sync per call): on by default,
    it refuses a NaN input naming it; off, the NaN flows through to the output."""
    torch = pytest.importorskip("torch")
    from vla_verify import VLAConfig, backends
    from vla_verify.errors import NonFiniteError

    q, k, v, u = (torch.as_tensor(x) for x in _tiny())
    k[0, 1, 0, 0] = float("nan")
    checked = backends.get("torch_chunked", variant="linear")
    with pytest.raises(NonFiniteError) as info:
        checked(q, k, v, u, config=VLAConfig.exact())
    assert info.value.argument == "k"
    unchecked = checked.bind(check_finite=False)
    # On the CPU the outputs are still checked: the NaN reaches them, past the inputs' check.
    with pytest.raises(NonFiniteResultError, match="o"):
        unchecked(q, k, v, u, config=VLAConfig.exact())
    with pytest.raises(ConfigError):
        backends.get("torch_chunked", check_finite="no")
