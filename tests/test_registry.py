"""The backend registry: what exists, what runs here, and why not (issue 2 §5)."""

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
