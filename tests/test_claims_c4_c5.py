"""Meta-tests of claims C4 and C5 (spec §3)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from claims_support import TINY, tiny_context

# The adversary engine differentiates through the recurrence with PyTorch.
pytest.importorskip("torch")

from vla_verify.proofs.claims import c4_jacobian, c5_bounded_state
from vla_verify.proofs.ledger import Verdict
from vla_verify.properties import invariants
from vla_verify.properties.strategies import Case
from vla_verify.spec import VLAConfig


def test_c4_step_only_if_parallel_and_delta_holds(tmp_path):
    vla = c4_jacobian.run_step(tiny_context(tmp_path))
    assert vla.verdict is Verdict.HOLDS_ONLY_IF
    assert "∥" in vla.condition
    assert 1.0 < vla.figures["max_step_norm"] < (1 + 5**0.5) / 2
    delta = c4_jacobian.run_step(tiny_context(tmp_path), variant="delta")
    assert delta.verdict is Verdict.HOLDS


def test_c4_product_finds_a_certified_explosion(tmp_path):
    """The adversary finds a product above the ceiling 10 (certified, replays), below the proven
    bound; vanishing is reported beside it with the delta rule's."""
    from vla_verify.proofs import certificates

    ctx = tiny_context(tmp_path)
    ctx.profile = dataclasses.replace(
        ctx.profile, product_dk=(8,), product_T=48, adversary_steps=40
    )
    result = c4_jacobian.run_product(ctx)
    worst = result.figures["worst_product_norm"]
    assert result.verdict is Verdict.FAILS and worst > c4_jacobian.EXPLODE
    assert result.certified is True and certificates.replay(result.counterexample).ok
    row = result.figures["by_setting"]["dk=8 lambda0=0.1"]
    assert row["worst_product_norm"] <= row["proven_bound"]
    assert result.figures["min_product_norm_delta"] < c4_jacobian.VANISH
    assert result.figures["delta_vanishes_too"] is True


@pytest.mark.parametrize("unit_penalty", [False, True])
def test_c4_product_bound_holds_on_random_inputs(unit_penalty):
    rng = np.random.default_rng(0)
    for dk, lam in ((2, 0.1), (8, 1.0), (8, 0.1)):
        config = VLAConfig(lambda0=lam)
        T = 40
        u_sq = 1.0 if unit_penalty else 1.0 / dk
        k = rng.standard_normal((1, T, 1, dk))
        u = rng.standard_normal((1, T, 1, dk))
        u = u / np.linalg.norm(u, axis=-1, keepdims=True) * np.sqrt(u_sq)
        case = Case(k, k, np.ones((1, T, 1, 1)), u, None, 1)
        logs = invariants.jacobian_product_norm(case, config, cumulative=True)[0, :, 0]
        bound = c4_jacobian.product_bound(config, dk, T, u_sq=u_sq)
        assert np.all(10**logs <= bound * (1 + 1e-9))


def test_c4_product_bound_is_tight_per_step():
    """One step from A_0 = I/λ0 with the penalty along e_1: κ(A_1) = 1 + ||u||²/λ0 exactly (no
    nudge yet), and the key that attains Kantorovich's cosine gives the bound's first factor."""
    lam, dk = 0.1, 2
    config = VLAConfig(lambda0=lam)
    for u_sq in (1.0 / dk, 1.0):
        kappa = 1 + u_sq / lam
        # A_1 = diag(1/(λ0 + u²), 1/λ0): c = k̂ᵀAk̂/||Ak̂|| is smallest (equality in
        # Kantorovich) at k̂_i ∝ 1/√a_i for A's eigenvalues a_i, i.e. (√(λ0 + u²), √λ0).
        k = np.array([np.sqrt(lam + u_sq), np.sqrt(lam)])
        k = (k / np.linalg.norm(k)).reshape(1, 1, 1, dk)
        u = np.array([np.sqrt(u_sq), 0.0]).reshape(1, 1, 1, dk)
        case = Case(k, k, np.ones((1, 1, 1, 1)), u, None, 1)
        measured = 10 ** invariants.jacobian_product_norm(case, config)[0, 0]
        bound = c4_jacobian.product_bound(config, dk, 1, u_sq=u_sq)[0]
        c_min = 2 * np.sqrt(kappa) / (1 + kappa)
        assert bound == pytest.approx(float(invariants.rank_one_sigma_max(c_min)))
        assert measured == pytest.approx(bound, rel=1e-9)


def _c4_context(tmp_path, **overrides):
    ctx = tiny_context(tmp_path)
    ctx.profile = dataclasses.replace(ctx.profile, **overrides)
    return ctx


def test_c4_product_dk64_worst_is_saved_and_replays(tmp_path, capsys):
    """The worst product at dk = 64, lambda0 = 0.1 goes to C4.product.dk64.json whether or not it
    passes the ceiling; --replay re-measures it in float64 (the interval product at dk = 64 is
    beyond its budget) and gets the recorded figure."""
    from vla_verify import cli
    from vla_verify.proofs import certificates

    ctx = _c4_context(tmp_path, product_dk=(64,), product_T=20, adversary_steps=20)
    result = c4_jacobian.run_product(ctx)
    figure = result.figures["worst_product_norm_dk64_lambda0_0.1"]
    path = tmp_path / "counterexamples" / "C4.product.dk64.json"
    cx = certificates.load(path)
    assert cx.arrays()["k"].shape[-1] == 64 and cx.config["lambda0"] == 0.1
    assert certificates.measure(cx) == pytest.approx(figure, rel=1e-12)
    row = result.figures["by_setting"]["dk=64 lambda0=0.1"]
    assert 1.0 < figure <= row["proven_bound"]
    assert set(row["by_subspace_dim"]) == set(c4_jacobian.LIFT_DIMS["quick"])
    assert cli.main(["claims", "--replay", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"replayed in float64: {cx.measured:.17g}" in out and "NOT reproduced" not in out
    assert "float64 re-measure only" in out


@pytest.fixture(scope="module")
def c4_classes(tmp_path_factory):
    """C4.product over both input classes at dk = 8, T = 32 (tiny profile)."""
    out = {}
    for name, run_ in (
        ("unit", c4_jacobian.run_product_unit_penalty),
        ("layer", c4_jacobian.run_product),
    ):
        ctx = _c4_context(tmp_path_factory.mktemp(name), product_dk=(8,), product_T=32)
        out[name] = run_(ctx)
    return out


def test_c4_product_unit_penalty_is_its_own_class(c4_classes):
    """Unit penalties (||u_t|| = 1): a proven bound far above the ledger class's, a certified
    product above the ceiling that exceeds what the search finds in the ledger class at the same
    settings, below its own bound; the formalisation names the class and the preset."""
    unit_, layer = c4_classes["unit"], c4_classes["layer"]
    assert unit_.id == "C4.product.unit_penalty"
    assert "||u_t|| = 1" in unit_.formalisation and "paper" in unit_.formalisation
    assert "||u_t||² = 1/dk" in layer.formalisation and "paper" in layer.formalisation
    for key, row in unit_.figures["by_setting"].items():
        assert row["worst_product_norm"] <= row["proven_bound"]
        assert row["proven_bound"] > layer.figures["by_setting"][key]["proven_bound"]
    row_u = unit_.figures["by_setting"]["dk=8 lambda0=0.1"]
    row_l = layer.figures["by_setting"]["dk=8 lambda0=0.1"]
    assert row_u["worst_product_norm"] > row_l["worst_product_norm"]
    assert unit_.verdict is Verdict.FAILS and unit_.certified is True
    assert unit_.figures["worst_product_norm"] > c4_jacobian.EXPLODE


def test_c4_replay_of_a_violation_beyond_the_interval_budget(
    c4_classes, tmp_path, capsys, monkeypatch
):
    """A counterexample whose interval check costs more than the budget replays in float64 (exit
    0, said so); a tampered figure does not reproduce (exit 1)."""
    import json

    from vla_verify import cli
    from vla_verify.proofs import ledger

    path = c4_classes["unit"].counterexample
    monkeypatch.setattr(ledger, "REPLAY_INTERVAL_BUDGET", 0)
    assert cli.main(["claims", "--replay", path]) == 0
    out = capsys.readouterr().out
    assert "float64 re-measure only" in out and "still fails: yes (float64 only)" in out
    data = json.loads(Path(path).read_text())
    data["measured"] = data["measured"] * 2
    tampered = tmp_path / "tampered.json"
    tampered.write_text(json.dumps(data))
    assert cli.main(["claims", "--replay", str(tampered)]) == 1


def test_c4_unnormalised_depends_on_lambda0(tmp_path):
    paper = c4_jacobian.run_unnormalised(tiny_context(tmp_path))
    assert paper.verdict is Verdict.NOT_REPRODUCED
    assert paper.figures["log10_product"] <= paper.figures["proven_bound_log10"]
    small = c4_jacobian.run_unnormalised(tiny_context(tmp_path), lambda0=0.03)
    assert small.verdict is Verdict.REPRODUCED


@pytest.fixture(scope="module")
def c5_results(tmp_path_factory):
    ctx = tiny_context(tmp_path_factory.mktemp("c5"))
    return {r.id: r for r in c5_bounded_state.run(ctx)}


def test_c5_paper_preset_fails_by_search(c5_results):
    """Under the paper preset the adversary's state grows over two decades of T: FAILS, with the
    exponent fitted by least squares and the baselines' known growth reproduced beside it."""
    paper = c5_results["C5.paper"]
    assert paper.verdict is Verdict.FAILS
    exponents = paper.figures["exponent"]
    assert exponents["vla.paper dk=2"] > 0.3
    assert exponents["linear dk=2"] == pytest.approx(1.0, abs=0.01)  # O(T), tight
    assert exponents["delta dk=2"] == pytest.approx(0.5, abs=0.01)  # √T, tight
    ratio = paper.figures["ratio_to_delta_worst_case"]
    assert ratio[max(ratio)] > 5  # far beyond the delta rule's worst case
    assert paper.figures["calibration"]["delta"] >= 0.95
    assert "gradient search" in " ".join(paper.evidence)
    assert c5_results["C5.exact"].verdict is Verdict.FAILS
    assert set(paper.series["state_norms_random"]) == {"linear", "delta", "vla", "rls"}


def test_c5_counterexamples_replay(c5_results):
    """The longest counterexample reproduces in float64; its prefix is certified in intervals."""
    from vla_verify.proofs import certificates

    paper = c5_results["C5.paper"]
    cx = certificates.load(paper.counterexample)
    assert cx.arrays()["k"].shape[1] == TINY.growth_T[-1]  # the longest T
    assert certificates.measure(cx) == pytest.approx(cx.measured, rel=1e-12)
    assert cx.measured > cx.claimed
    prefix = Path(paper.counterexample).with_name(f"C5.paper.T{TINY.growth_T[-1] // 10}.json")
    assert certificates.replay(prefix).ok


def test_c4_product_certificate_on_a_known_vanishing_product():
    """With no penalty (u = 0) the gate is k̂ itself and each step is the projector I − k̂k̂ᵀ;
    alternating keys 60° apart give ||X_1 ⋯ X_t||₂ = cos(60°)^(t-1) = 2^-(t-1) exactly."""
    from vla_verify.proofs import certificates
    from vla_verify.properties.strategies import Case

    T = 6
    keys = np.array([[1.0, 0.0], [0.5, np.sqrt(3) / 2]])[np.arange(T) % 2]
    k = keys.reshape(1, T, 1, 2)
    case = Case(k + 1.0, k, np.ones((1, T, 1, 1)), np.zeros((1, T, 1, 2)), None, 1)
    config = VLAConfig.exact()
    cx = certificates.from_case(
        "C4.product", "jacobian_product_vanishing", case, config, (0, T - 1, 0)
    )
    assert cx.measured == pytest.approx(2.0 ** -(T - 1), rel=1e-12)
    assert certificates.recheck_interval(cx).certified  # 1/32 < 0.1, certainly
    early = certificates.from_case(
        "C4.product", "jacobian_product_vanishing", case, config, (0, 1, 0)
    )
    assert not certificates.recheck_interval(early).certified  # 1/2 is not below 0.1


@pytest.mark.slow
def test_c5_longest_counterexample_replays_through_the_cli(c5_results, capsys):
    """``vla-verify claims --replay`` certifies the longest file, raising the interval precision
    to what the length needs."""
    from vla_verify import cli

    assert cli.main(["claims", "--replay", c5_results["C5.paper"].counterexample]) == 0
    out = capsys.readouterr().out
    assert "still fails: yes" in out and "certified" in out
