"""The backend registry: what exists, what runs here, and why not."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from vla_verify import VLAConfig, backends
from vla_verify.backends.registry import Backend, Capabilities, _Entry, _load
from vla_verify.errors import (
    BackendUnavailableError,
    DeviceError,
    UnknownBackendError,
    UnsupportedConfigurationError,
)
from vla_verify.spec import Shapes

EXPECTED = {"numpy", "mpmath", "torch", "torch_chunked", "triton_fused", "triton_chunked"}


def test_every_named_backend_is_registered() -> None:
    assert EXPECTED <= set(backends.names())


def test_available_lists_every_backend_with_a_reason_when_absent() -> None:
    rows = {r.name: r for r in backends.available()}
    assert set(rows) == set(backends.names())
    assert rows["numpy"].available and rows["numpy"].reason is None
    assert rows["numpy"].capabilities.array == "numpy"
    for row in rows.values():
        assert row.available == (row.reason is None), row
        if not row.available:
            assert len(row.reason) > 10  # a sentence, not a flag


def test_get_returns_a_spec4_callable() -> None:
    oracle = backends.get("numpy")
    rng = np.random.default_rng(0)
    q, k, u = (rng.standard_normal((1, 3, 1, 2)) for _ in range(3))
    v = rng.standard_normal((1, 3, 1, 4))
    o, (S, A, z) = oracle(q, k, v, u, config=VLAConfig())
    assert o.shape == (1, 3, 1, 4) and S.shape == (1, 1, 4, 2) and A.shape == (1, 1, 2, 2)
    assert z.shape == (1, 1, 2)
    assert o.dtype == np.float64
    o32, _ = oracle(*(x.astype(np.float32) for x in (q, k, v, u)), config=VLAConfig())
    assert o32.dtype == np.float32


def test_bind_changes_variant_and_options() -> None:
    b = backends.get("mpmath").bind(variant="delta", dps=30)
    assert b.variant == "delta" and b.options["dps"] == 30
    with pytest.raises(UnsupportedConfigurationError) as info:
        backends.get("mpmath", digits=30)
    assert info.value.argument == "digits" and "dps" in str(info.value)


def test_unknown_backend() -> None:
    with pytest.raises(UnknownBackendError, match=r"^backend: expected one of .*'numpy'"):
        backends.get("cuda_magic")


def test_check_support_gives_reasons() -> None:
    numpy_backend = backends.get("numpy")
    shapes = Shapes(1, 4, 1, 2, 2)
    assert numpy_backend.check_support(VLAConfig(), shapes, "float64") is None
    assert "bfloat16" in numpy_backend.check_support(VLAConfig(), shapes, "bfloat16")
    assert "cuda" in numpy_backend.check_support(VLAConfig(), shapes, "float64", "cuda")
    reason = numpy_backend.check_support(VLAConfig(), shapes, "float64", variant="rls")
    assert "VLAConfig.exact()" in reason


def test_calling_with_an_unsupported_request_raises_the_reason() -> None:
    x = np.zeros((1, 2, 1, 2), dtype=np.float16)
    with pytest.raises(UnsupportedConfigurationError, match="max_work"):
        backends.get("mpmath")(*(np.ones((1, 200, 8, 16)),) * 4)
    assert backends.get("numpy")(x, x, x, x)[0].dtype == np.float16


def test_missing_package_and_missing_module_are_reasons() -> None:
    entry = _Entry("ghost", "vla_verify.backends.ghost", "Ghost", "test", ("no_such_pkg_xyz",), "")
    with pytest.raises(BackendUnavailableError, match="no_such_pkg_xyz, not installed"):
        _load(entry)
    entry = _Entry("ghost", "vla_verify.backends.ghost", "Ghost", "test", ("numpy",), "")
    with pytest.raises(BackendUnavailableError, match="not implemented in this version"):
        _load(entry)


def test_unavailable_device_raises_when_called() -> None:
    class NoDevice(Backend):
        name = "nodevice"
        capabilities = Capabilities(array="numpy", devices=("cpu",), dtypes=("float64",))

        def availability(self):
            return "no CUDA GPU on this machine"

        def _run(self, *args, **kwargs):  # pragma: no cover - never reached
            raise AssertionError

    x = np.zeros((1, 1, 1, 1))
    with pytest.raises(BackendUnavailableError, match="no CUDA GPU"):
        NoDevice()(x, x, x, x)


def test_inputs_on_two_devices_are_refused() -> None:
    torch = pytest.importorskip("torch")

    class Meta(Backend):
        name = "meta"
        capabilities = Capabilities(array="torch", devices=("cpu", "meta"), dtypes=("float32",))

        def _run(self, *args, **kwargs):  # pragma: no cover - never reached
            raise AssertionError

    cpu = torch.zeros(1, 1, 1, 1)
    meta = torch.zeros(1, 1, 1, 1, device="meta")
    with pytest.raises(DeviceError, match=r"^q: expected every input on one device"):
        Meta()(cpu, cpu, cpu, meta)
    with pytest.raises(DeviceError, match=r"^q: backend 'numpy' runs on \('cpu',\), got 'meta'"):
        backends.get("numpy")(meta, meta, meta, meta)


def test_selected_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(backends.ENV_VAR, raising=False)
    here = [r.name for r in backends.available() if r.available]
    assert backends.selected() == here and "numpy" in here
    assert backends.selected(default="numpy") == ["numpy"]
    monkeypatch.setenv(backends.ENV_VAR, "numpy, mpmath")
    assert backends.selected() == ["numpy", "mpmath"]
    monkeypatch.setenv(backends.ENV_VAR, "numpy,nope")
    with pytest.raises(UnknownBackendError, match="VLA_VERIFY_BACKENDS"):
        backends.selected()
    monkeypatch.setenv(backends.ENV_VAR, "all")
    assert "numpy" in backends.selected()


def test_import_needs_no_torch_triton_or_matplotlib() -> None:
    code = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] in ('torch', 'triton', 'fla', 'matplotlib'):\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import vla_verify, vla_verify.oracle, vla_verify.cli\n"
        "rows = vla_verify.backends.available()\n"
        "print('ok', sorted(r.name for r in rows if r.available))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("ok") and "numpy" in out.stdout


def test_array_library_must_match_the_backend() -> None:
    torch = pytest.importorskip("torch")
    x = torch.zeros(1, 1, 1, 1, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"^q: backend 'numpy' takes numpy arrays, got torch"):
        backends.get("numpy")(x, x, x, x)


# -- arguments first, and no silent non-finite result ------------------------------------------


def _skip_unless_installed(name: str) -> None:
    """Skip where the backend's packages are absent (the `numpy` tox env has no torch)."""
    status = {s.name: s for s in backends.available()}[name]
    if not status.available:
        pytest.skip(f"{name}: {status.reason}")


def _tiny(dtype=np.float64):
    rng = np.random.default_rng(0)
    q, k, u = (rng.standard_normal((1, 3, 1, 2)).astype(dtype) for _ in range(3))
    v = rng.standard_normal((1, 3, 1, 2)).astype(dtype)
    return q, k, v, u


@pytest.mark.parametrize("name", ["numpy", "mpmath", "torch", "torch_chunked"])
@pytest.mark.parametrize("config", [{"lambda0": 0.1}, "paper", 0.1])
def test_a_config_of_the_wrong_type_names_config(name: str, config: object) -> None:
    from vla_verify.errors import ConfigError

    _skip_unless_installed(name)
    backend = backends.get(name)
    args = _tiny()
    if backend.capabilities.array == "torch":
        torch = pytest.importorskip("torch")
        args = tuple(torch.tensor(x) for x in args)
    with pytest.raises(ConfigError) as info:
        backend(*args, config=config)
    assert info.value.argument == "config"
    assert "expected a VLAConfig or None" in str(info.value)


@pytest.mark.parametrize(
    ("name", "options", "argument"),
    [
        ("mpmath", {"dps": 2.5}, "dps"),
        ("mpmath", {"dps": 0}, "dps"),
        ("mpmath", {"max_work": -1}, "max_work"),
        ("torch_chunked", {"chunk_size": "16"}, "chunk_size"),
        ("numpy", {"chunk_size": 16}, "chunk_size"),
    ],
)
def test_bad_options_are_refused_at_get_and_bind(name: str, options: dict, argument: str) -> None:
    from vla_verify.errors import VLAInputError

    _skip_unless_installed(name)
    with pytest.raises(VLAInputError) as info:
        backends.get(name, **options)
    assert info.value.argument == argument
    with pytest.raises(VLAInputError) as info:
        backends.get(name).bind(**options)
    assert info.value.argument == argument


def test_variant_and_name_of_the_wrong_type_are_named() -> None:
    from vla_verify.errors import UnknownVariantError

    with pytest.raises(UnknownVariantError):
        backends.get("numpy", variant=["vla"])
    with pytest.raises(UnknownBackendError):
        backends.get(None)  # type: ignore[arg-type]


def _floor_overflow_case():
    """One head, dk = 1, an indefinite initial ``A = -1000``: ``1 + uᵀAu < 0``, so δ sits at the
    floor and ``A`` grows by ``|A|²/sm_floor`` per step until float32 overflows at step 3: the
    sequential float32 recurrence turns it into a NaN output."""
    ones = np.ones((1, 3, 1, 1), dtype=np.float32)
    state = (
        np.zeros((1, 1, 1, 1), np.float32),
        np.full((1, 1, 1, 1), -1000.0, np.float32),
        np.ones((1, 1, 1), np.float32),
    )
    return (ones, ones, ones, ones), state


@pytest.mark.parametrize(("name", "where"), [("torch", "o"), ("torch_chunked", "state.A")])
def test_torch_backends_report_a_non_finite_result(name: str, where: str) -> None:
    """The float32 ``torch`` backend returns NaN in ``o`` on this input (``torch_chunked`` a
    finite ``o`` with ``A = -inf``): both are reported, naming the output."""
    torch = pytest.importorskip("torch")
    from vla_verify.errors import NonFiniteResultError

    args, state = _floor_overflow_case()
    t = lambda x: torch.tensor(x)  # noqa: E731
    with pytest.raises(NonFiniteResultError) as info:
        backends.get(name)(
            *map(t, args), config=VLAConfig.exact(), initial_state=tuple(map(t, state))
        )
    assert info.value.where == where and info.value.backend == name


def test_reference_backends_raise_on_a_non_finite_result() -> None:
    from vla_verify.errors import IllConditionedError, NonFiniteResultError

    args, state = _floor_overflow_case()
    with pytest.raises(NonFiniteResultError):
        backends.get("numpy")(*args, config=VLAConfig.exact(), initial_state=state)
    big = tuple(x.astype(np.float64) * 1e200 for x in _tiny())
    with pytest.raises((NonFiniteResultError, IllConditionedError)):
        backends.get("mpmath")(*big, config=VLAConfig.exact())


def test_reference_backends_refuse_what_they_cannot_resolve() -> None:
    """The six-token problem with ||u|| ~ 1e8: float64 is percent-level off (numpy refuses);
    mpmath at 20 digits is off too and refuses, at 100 digits it agrees with itself."""
    from vla_verify.errors import IllConditionedError

    rng = np.random.default_rng(0)
    q, k = (np.exp(rng.standard_normal((1, 6, 1, 3))) for _ in range(2))
    v = rng.standard_normal((1, 6, 1, 2))
    u = rng.standard_normal((1, 6, 1, 3)) * 1e8
    with pytest.raises(IllConditionedError) as info:
        backends.get("numpy")(q, k, v, u, config=VLAConfig.exact())
    assert info.value.step is not None and info.value.figure
    with pytest.raises(IllConditionedError):
        backends.get("mpmath", dps=20)(q, k, v, u, config=VLAConfig.exact())
    o, _ = backends.get("mpmath", dps=100)(q, k, v, u, config=VLAConfig.exact())
    assert np.all(np.isfinite(o))
