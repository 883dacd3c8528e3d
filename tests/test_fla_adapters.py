"""flash-linear-attention's kernels through the conformance interface (spec §4, §5).

Without a GPU these run fla's Triton kernels on CPU tensors through Triton's interpreter
(``tests/conftest.py`` sets ``TRITON_INTERPRET=1`` before triton is imported); with one, on CUDA.
Shapes are tiny so the module stays well under a minute on one core.  Skipped where fla is absent.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from vla_verify import VLAConfig, validate
from vla_verify.errors import UnsupportedConfigurationError
from vla_verify.properties.strategies import ShapeBounds
from vla_verify.spec import Shapes

torch = pytest.importorskip("torch")

from vla_verify.adapters import fla as adapters  # noqa: E402  (after the torch skip)

CUDA = bool(torch.cuda.is_available())
DEVICE = "cuda" if CUDA else "cpu"
BOUNDS = ShapeBounds(max_T=16, max_dk=8, max_dv=8)
SMALL = ShapeBounds(max_T=8, max_dk=4, max_dv=4)  # for failing checks: shrinking re-runs fn
DELTA = VLAConfig(normalize_output=False)


@pytest.fixture(scope="module")
def fla() -> Any:
    """fla itself; skips where it is absent (pip install --no-deps fla-core==0.6.0 einops)."""
    pytest.importorskip("triton")
    return pytest.importorskip("fla")


def _inputs(B: int = 2, T: int = 11, H: int = 2, dk: int = 5, dv: int = 3, seed: int = 0) -> Any:
    rng = np.random.default_rng(seed)
    q = np.abs(rng.standard_normal((B, T, H, dk))) + 0.1
    k = rng.standard_normal((B, T, H, dk))
    v = rng.standard_normal((B, T, H, dv))
    u = rng.standard_normal((B, T, H, dk)) / np.sqrt(dk)
    S0 = rng.standard_normal((B, H, dv, dk))
    G = rng.standard_normal((B, H, dk, dk))
    A0 = np.linalg.inv(0.1 * np.eye(dk) + G @ np.swapaxes(G, -1, -2))
    A0 = 0.5 * (A0 + np.swapaxes(A0, -1, -2))
    z0 = np.abs(rng.standard_normal((B, H, dk))) * 3
    return (q, k, v, u), (S0, A0, z0)


def _torch(xs: Any, dtype: Any = None) -> Any:
    dtype = torch.float32 if dtype is None else dtype
    return tuple(torch.tensor(x, dtype=dtype, device=DEVICE) for x in xs)


# -- import hygiene -----------------------------------------------------------------------------


def test_importing_the_adapters_imports_no_external_library() -> None:
    code = (
        "import sys, vla_verify, vla_verify.adapters, vla_verify.adapters.fla; "
        "print(sorted(m for m in ('fla', 'torch', 'triton') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


# -- layouts (written once in the adapter, checked here) ----------------------------------------


def test_state_layout_round_trip_and_meaning() -> None:
    """``to_fla_state`` is the per-head transpose ``h = Sᵀ`` ``[B, H, dk, dv]``: ``Sq = hᵀq``."""
    rng = np.random.default_rng(1)
    S = torch.tensor(rng.standard_normal((2, 3, 4, 5)), dtype=torch.bfloat16)  # [B, H, dv, dk]
    q = torch.tensor(rng.standard_normal((2, 3, 5)), dtype=torch.float32)
    h = adapters.to_fla_state(S)
    assert h.shape == (2, 3, 5, 4) and h.dtype == torch.float32 and h.is_contiguous()
    assert torch.equal(adapters.from_fla_state(h, torch.bfloat16), S)
    ours = torch.einsum("bhvk,bhk->bhv", S.float(), q)
    fla_read = torch.einsum("bhkv,bhk->bhv", h, q)  # fla: o = hᵀ q
    torch.testing.assert_close(fla_read, ours)


@pytest.mark.triton
def test_state_layout_matches_what_fla_writes(fla: Any) -> None:
    """One delta-rule step from zero: fla's ``h = k̂ vᵀ`` ``[K, V]``, so ours is ``S = v k̂ᵀ``."""
    from fla.ops.delta_rule import fused_recurrent_delta_rule

    (q, k, v, _), _ = _inputs(B=1, T=1, H=1, dk=4, dv=3)
    qt, kt, vt = _torch((q, k / np.linalg.norm(k, axis=-1, keepdims=True), v))
    _, h = fused_recurrent_delta_rule(qt, kt, vt, scale=1.0, output_final_state=True)
    assert h.shape == (1, 1, 4, 3)
    torch.testing.assert_close(h[0, 0], torch.outer(kt[0, 0, 0], vt[0, 0, 0]))
    S = adapters.from_fla_state(h, torch.float32)
    torch.testing.assert_close(S[0, 0], torch.outer(vt[0, 0, 0], kt[0, 0, 0]))


# -- the (q, k, v, a, b) mapping of spec §5, directly against the oracle ------------------------


@pytest.mark.parametrize("name", ["fused_recurrent_iplr_vla", "fused_recurrent_dplr_vla"])
@pytest.mark.parametrize("normalize_output", [False, True])
@pytest.mark.triton
def test_generalized_delta_rule_mapping_matches_the_oracle(
    fla: Any, name: str, normalize_output: bool
) -> None:
    """k = α̂, a = −k̂, b = α̂ (gk = 0), scale = 1: fla's float32 state and outputs agree with the
    float64 oracle to float32 accuracy, from a given initial state, with dk ≠ dv and nudges."""
    from vla_verify.oracle import recurrence

    config = VLAConfig(nudge_period=4, normalize_output=normalize_output)
    inputs, state = _inputs()
    ref = recurrence(*inputs, config=config, initial_state=state)
    o, (S, A, z) = adapters.ADAPTERS[name](
        *_torch(inputs), config=config, initial_state=_torch(state)
    )
    assert A is None
    for got, want in ((o, ref.o), (S, ref.state[0]), (z, ref.state[2])):
        np.testing.assert_allclose(
            got.double().cpu().numpy(), want, rtol=2e-5, atol=2e-5 * np.abs(want).max()
        )


@pytest.mark.triton
def test_delta_mapping_matches_the_oracle(fla: Any) -> None:
    from vla_verify.oracle import recurrence

    inputs, state = _inputs(seed=3)
    ref = recurrence(*inputs, config=DELTA, variant="delta", initial_state=state)
    o, (S, A, _) = adapters.fused_recurrent_delta(
        *_torch(inputs), config=DELTA, initial_state=_torch(state)
    )
    assert A is None
    np.testing.assert_allclose(o.double().cpu().numpy(), ref.o, rtol=2e-5, atol=1e-5)
    np.testing.assert_allclose(S.double().cpu().numpy(), ref.state[0], rtol=2e-5, atol=1e-5)


# -- validate: the adapters pass ------------------------------------------------------------------

_PASSING = [
    ("fused_recurrent_delta", "delta", DELTA, "float32"),
    ("fused_recurrent_delta", "delta", VLAConfig(), "float32"),
    ("fused_recurrent_delta", "delta", DELTA, "bfloat16"),
    ("fused_recurrent_iplr_vla", "vla", VLAConfig(nudge_period=5), "float32"),
    ("fused_recurrent_iplr_vla", "vla", VLAConfig.exact(normalize_output=False), "bfloat16"),
    ("fused_recurrent_dplr_vla", "vla", VLAConfig(nudge_period=5), "float32"),
]
if CUDA:  # the chunk kernels run on a GPU only (the interpreter rejects their Triton code)
    _PASSING += [
        ("chunk_delta", "delta", DELTA, "bfloat16"),
        ("chunk_iplr_vla", "vla", VLAConfig(), "bfloat16"),
        ("chunk_dplr_vla", "vla", VLAConfig(), "bfloat16"),
    ]


@pytest.mark.parametrize(
    ("name", "variant", "config", "dtype"),
    _PASSING,
    ids=[f"{n}-{d}-{'norm' if c.normalize_output else 'raw'}" for n, _, c, d in _PASSING],
)
@pytest.mark.triton
def test_adapter_passes_validation(
    fla: Any, name: str, variant: str, config: VLAConfig, dtype: str
) -> None:
    report = validate(
        adapters.ADAPTERS[name],
        config=config,
        variant=variant,
        array="torch",
        dtype=dtype,
        device=DEVICE,
        max_examples=15,
        seed=0,
        bounds=BOUNDS,
    )
    assert report.passed, report.summary()
    assert report.examples >= 12


# -- validate: a broken adapter fails -------------------------------------------------------------


def _broken_default_scale(q, k, v, u, *, config, initial_state=None):  # type: ignore[no-untyped-def]
    """The delta adapter with fla's default ``scale = K**-0.5`` left in (the usual mistake)."""
    from fla.ops.delta_rule import fused_recurrent_delta_rule

    k_hat = torch.nn.functional.normalize(k.float(), dim=-1).to(q.dtype)
    h0 = None if initial_state is None else adapters.to_fla_state(initial_state[0])
    o, h = fused_recurrent_delta_rule(q, k_hat, v, initial_state=h0, output_final_state=True)
    return o, (adapters.from_fla_state(h, q.dtype), None, None)


def _broken_reshape_layout(q, k, v, u, *, config, initial_state=None):  # type: ignore[no-untyped-def]
    """The delta adapter that *reshapes* fla's ``[K, V]`` state instead of transposing it."""
    from fla.ops.delta_rule import fused_recurrent_delta_rule

    B, _, H, dk = q.shape
    dv = v.shape[-1]
    k_hat = torch.nn.functional.normalize(k.float(), dim=-1).to(q.dtype)
    h0 = None
    if initial_state is not None:
        h0 = initial_state[0].float().reshape(B, H, dk, dv).contiguous()
    o, h = fused_recurrent_delta_rule(
        q, k_hat, v, scale=1.0, initial_state=h0, output_final_state=True
    )
    return o, (h.reshape(B, H, dv, dk).to(q.dtype), None, None)


def _broken_sign(q, k, v, u, *, config, initial_state=None):  # type: ignore[no-untyped-def]
    """The IPLR adapter with ``a = +k̂`` (the sign of spec §5's mapping lost)."""
    from fla.ops.generalized_delta_rule import fused_recurrent_iplr_delta_rule

    gate, k_hat = adapters.oracle_gates(q, k, v, u, config=config, initial_state=initial_state)
    h0 = None if initial_state is None else adapters.to_fla_state(initial_state[0])
    with adapters._first_config_when_interpreting(
        adapters.KERNELS["fused_recurrent_iplr_delta_rule"]
    ):
        o, h = fused_recurrent_iplr_delta_rule(
            q, gate, v, k_hat, gate, scale=1.0, initial_state=h0, output_final_state=True
        )
    return o, (adapters.from_fla_state(h, q.dtype), None, None)


_BROKEN = [
    (_broken_default_scale, "delta", DELTA),
    (_broken_reshape_layout, "delta", DELTA),
    (_broken_sign, "vla", VLAConfig.exact(normalize_output=False)),
]


@pytest.mark.parametrize(
    ("fn", "variant", "config"), _BROKEN, ids=[f.__name__.strip("_") for f, _, _ in _BROKEN]
)
@pytest.mark.triton
def test_broken_adapter_is_rejected(fla: Any, fn: Any, variant: str, config: VLAConfig) -> None:
    report = validate(
        fn,
        config=config,
        variant=variant,
        array="torch",
        dtype="float32",
        device=DEVICE,
        max_examples=12,
        seed=0,
        bounds=SMALL,
    )
    assert not report.passed
    failure = report.failures[0]
    assert failure.kind in ("mismatch", "carry"), failure.describe()
    assert "outside the error budget" in failure.message or failure.kind == "carry"


# -- declared refusals and availability -----------------------------------------------------------


def test_chunk_delta_refuses_float32_with_fla_s_reason() -> None:
    reason = adapters.chunk_delta.check_support(DELTA, Shapes(1, 4, 1, 4, 4), "float32", "cuda")
    assert reason is not None and "does not support float32" in reason
    with pytest.raises(UnsupportedConfigurationError, match="does not support float32"):
        validate(adapters.chunk_delta, config=DELTA, variant="delta", array="torch",
                 dtype="float32", max_examples=1)  # fmt: skip


@pytest.mark.parametrize("name", sorted(adapters.ADAPTERS))
def test_every_adapter_refuses_float64_and_the_wrong_variant(name: str) -> None:
    adapter = adapters.ADAPTERS[name]
    shapes = Shapes(1, 4, 1, 4, 4)
    assert "float64" in (adapter.check_support(VLAConfig(), shapes, "float64", "cuda") or "")
    other = "vla" if adapter.variant == "delta" else "delta"
    reason = adapter.check_support(VLAConfig(), shapes, "bfloat16", "cuda", variant=other)
    assert reason is not None and f"--variant {adapter.variant}" in reason


@pytest.mark.skipif(CUDA, reason="the interpreter's limits only matter without a GPU")
@pytest.mark.parametrize("name", ["chunk_delta", "chunk_iplr_vla", "chunk_dplr_vla"])
def test_chunk_kernels_say_why_they_do_not_run_in_the_interpreter(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    adapter = adapters.ADAPTERS[name]
    reason = adapter.check_support(VLAConfig(), Shapes(1, 4, 1, 4, 4), "bfloat16", "cpu")
    assert reason is not None and "interpreter" in reason and "CUDA GPU" in reason
    if not adapters._missing():
        assert adapter.availability() == reason


@pytest.mark.skipif(CUDA, reason="with a GPU the kernels need no interpreter")
def test_availability_names_the_missing_interpreter_and_package(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    if not adapters._missing():
        assert "TRITON_INTERPRET=1" in (adapters.fused_recurrent_delta.availability() or "")
    monkeypatch.setattr(adapters, "_missing", lambda: ["fla"])
    reason = adapters.fused_recurrent_delta.availability() or ""
    assert "fla" in reason and "pip install --no-deps fla-core==0.6.0" in reason


def test_registry_lists_fla_with_a_reason_when_it_cannot_run() -> None:
    from vla_verify.backends import available, names

    assert "fla" in names()
    row = next(r for r in available() if r.name == "fla")
    assert row.available == (row.reason is None)
    if not row.available:
        assert row.reason


@pytest.mark.skipif(CUDA, reason="the interpreter workaround only applies without a GPU")
@pytest.mark.triton
def test_interpreter_autotune_restriction_is_undone_after_the_call(fla: Any) -> None:
    kernel = adapters.KERNELS["fused_recurrent_iplr_delta_rule"]
    inputs, _ = _inputs(B=1, T=3, H=1, dk=3, dv=2)
    adapters.fused_recurrent_iplr_vla(*_torch(inputs), config=VLAConfig())
    tuners = adapters._autotuners(kernel.impl_module)
    assert tuners and all("prune_configs" not in t.__dict__ for t in tuners)


# -- the command line -----------------------------------------------------------------------------


@pytest.mark.triton
def test_cli_check_runs_an_adapter(fla: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from vla_verify.cli import main

    code = main(
        [
            "check",
            "vla_verify.adapters.fla:fused_recurrent_delta",
            "--variant", "delta", "--array", "torch", "--dtype", "float32",
            "--device", DEVICE, "--set", "normalize_output=false", "--exact",
            "--max-examples", "6", "--seed", "0", "--quiet",
            # The CLI path is under test, not the checker's reach: small shapes, since the
            # interpreted kernel takes minutes at the default sizes.
            *(() if CUDA else ("--max-dk", "16", "--max-T", "80")),
        ]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert "PASSED" in out


@pytest.mark.skipif(CUDA, reason="on a GPU the chunk kernels run")
def test_cli_check_reports_a_refusal_as_a_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from vla_verify.cli import main

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    code = main(
        [
            "check", "vla_verify.adapters.fla:chunk_iplr_vla", "--array", "torch",
            "--dtype", "float32", "--max-examples", "2", "--quiet",
        ]
    )  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    # Without triton or fla installed the refusal names the missing packages; with them, the
    # interpreter that fla's chunk kernels do not run under.
    missing = [name for name in ("triton", "fla") if importlib.util.find_spec(name) is None]
    if missing:
        assert "not installed" in err and all(name in err for name in missing), err
    else:
        assert "interpreter" in err, err
