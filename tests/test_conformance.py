"""Every selected backend against the oracle (``VLA_VERIFY_BACKENDS``; default: all available).

The same checker users run (``validate``), per variant and dtype the backend declares; a backend
that is unavailable here, or declines a request, is skipped with the registry's reason.
"""

from __future__ import annotations

import pytest

from vla_verify import VLAConfig, backends, validate
from vla_verify.errors import BackendUnavailableError
from vla_verify.properties.strategies import ShapeBounds
from vla_verify.spec import Shapes

SELECTED = backends.selected()
#: Small shapes (the property tests' sizes) for every backend × variant × dtype: the default
#: conformance sizes, which reach tiling widths and chunk boundaries, are checked once per
#: correct backend in tests/meta/test_checker_reach.py.  The interpreted Triton and mpmath
#: backends are slow per token: smaller still.
#: triton_chunked's chunk boundaries are tests/test_triton_chunked.py's concern.
BOUNDS = {
    "mpmath": ShapeBounds(max_B=1, max_H=1, max_T=24, max_dk=3, max_dv=3),
    "triton_fused": ShapeBounds(max_B=2, max_H=2, max_T=24, max_dk=8, max_dv=8),
    "triton_chunked": ShapeBounds(max_B=2, max_H=2, max_T=16, max_dk=4, max_dv=4),
}
EXAMPLES = {"mpmath": 8, "triton_fused": 4, "triton_chunked": 3}
_ONE = Shapes(1, 1, 1, 1, 1)


def _cases():
    for name in SELECTED:
        for variant in ("vla", "delta", "linear", "rls"):
            for dtype in ("float64", "float32", "bfloat16"):
                yield pytest.param(name, variant, dtype, id=f"{name}-{variant}-{dtype}")


@pytest.mark.parametrize(("name", "variant", "dtype"), list(_cases()))
def test_backend_conforms(name: str, variant: str, dtype: str) -> None:
    try:
        backend = backends.get(name, variant=variant)
    except BackendUnavailableError as exc:
        pytest.skip(exc.reason)
    reason = backend.availability()
    if reason is not None:
        pytest.skip(reason)
    caps = backend.capabilities
    if variant not in caps.variants or dtype not in caps.dtypes:
        pytest.skip(f"{name} does not declare variant={variant} dtype={dtype}")
    config = VLAConfig.exact() if variant == "rls" else VLAConfig(nudge_period=8)
    if backend.check_support(config, _ONE, dtype) is not None:
        config = VLAConfig.exact()  # e.g. a chunked backend whose chunk does not divide 8
    if backend.check_support(config, _ONE, dtype) is not None:
        pytest.skip(backend.check_support(config, _ONE, dtype))
    device = "cpu" if "cpu" in caps.devices else caps.devices[0]
    report = validate(
        backend,
        config=config,
        variant=variant,
        array=caps.array,
        dtype=dtype,
        device=device,
        max_examples=EXAMPLES.get(name, 25),
        seed=1,
        bounds=BOUNDS.get(name, ShapeBounds()),
    )
    assert report.passed, report.summary()
