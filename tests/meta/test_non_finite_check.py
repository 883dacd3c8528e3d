"""Meta-test of the registry's non-finite output check (Backend.__call__): a planted backend that
silently returns NaN from finite inputs must be reported, unless it opts out."""

from __future__ import annotations

import numpy as np
import pytest

from vla_verify.backends.registry import Backend, Capabilities
from vla_verify.errors import NonFiniteResultError


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
