"""Smoke tests of vla_verify.experiments: every task and mixer end to end at tiny sizes (CPU)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import numpy as np
import pytest

from vla_verify.errors import ConfigError, UnknownVariantError
from vla_verify.experiments.grids import RECIPE, grid_jobs
from vla_verify.experiments.tasks import IGNORE, CopyTask, MQARTask, exact_match, make_task

torch = pytest.importorskip("torch")

from vla_verify import VLAConfig, backends  # noqa: E402
from vla_verify.experiments import probe  # noqa: E402
from vla_verify.experiments.model import MIXERS, Backbone, ModelConfig, gated_delta_rule  # noqa: E402
from vla_verify.experiments.runner import run_grid  # noqa: E402
from vla_verify.experiments.train import (  # noqa: E402
    TrainConfig,
    TrainingPaused,
    loss_fell,
    lr_at,
    train,
)

TINY = dict(vocab=24, d_model=16, n_heads=2, d_ffn=32)
STEPS = TrainConfig(steps=30, batch_size=16, lr=1e-2, eval_samples=32, eval_batch=32)


@pytest.fixture(autouse=True)
def one_thread():
    """Two shared cores: one torch thread per process avoids oversubscription."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# -- tasks -------------------------------------------------------------------------------------


def test_mqar_asks_every_key_once_for_its_value():
    task = MQARTask(n_pairs=5, seq_len=40, vocab=30)
    batch = task.batch(8, seed=3, index=0)
    assert batch.tokens.shape == batch.targets.shape == (8, 40)
    for tokens, targets in zip(batch.tokens, batch.targets, strict=True):
        pairs = dict(zip(tokens[0:10:2], tokens[1:10:2], strict=True))
        assert len(pairs) == 5  # distinct keys
        asked = np.flatnonzero(targets != IGNORE)
        assert len(asked) == 5 and asked.min() >= 10
        assert sorted(tokens[asked]) == sorted(pairs)
        assert all(targets[p] == pairs[tokens[p]] for p in asked)
    # the metric: an oracle that looks the key up scores 1, echoing the input scores 0
    lookup = np.where(batch.targets != IGNORE, batch.targets, 0)
    assert exact_match(lookup, batch.targets) == 1.0
    assert exact_match(batch.tokens, batch.targets) == 0.0
    same = task.batch(8, seed=3, index=0)
    assert np.array_equal(same.tokens, batch.tokens)
    assert not np.array_equal(task.batch(8, seed=3, index=1).tokens, batch.tokens)


def test_copy_targets_the_prefix_not_the_input():
    task = CopyTask(length=7, vocab=50)
    batch = task.batch(64, seed=0, index=0)
    L = 7
    assert batch.tokens.shape == (64, 2 * L) and batch.scored == 64 * L
    scored = batch.targets != IGNORE
    assert scored[:, L:].all() and not scored[:, :L].any()
    copier = np.zeros_like(batch.tokens)
    copier[:, L:] = batch.tokens[:, :L]  # position L + j emits prefix token j + 1
    assert exact_match(copier, batch.targets) == 1.0
    assert exact_match(batch.tokens, batch.targets) < 0.1  # the identity is not a copy


def test_tasks_refuse_impossible_sizes():
    with pytest.raises(ConfigError, match="seq_len"):
        MQARTask(n_pairs=10, seq_len=20)
    with pytest.raises(ConfigError, match="n_pairs"):
        MQARTask(n_pairs=70, seq_len=300, vocab=128)
    with pytest.raises(UnknownVariantError, match="mixer"):
        ModelConfig(mixer="gru")


# -- mixers and training -----------------------------------------------------------------------


def test_gated_delta_rule_with_unit_beta_is_the_delta_variant():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 9, 3, 4, generator=g, dtype=torch.float64) for _ in range(3))
    k = torch.nn.functional.normalize(k, dim=-1)
    o, S = gated_delta_rule(q, k, v, torch.ones(2, 9, 3, dtype=torch.float64))
    ref, (S_ref, _, _) = backends.get("torch", variant="delta")(
        q, k, v, torch.zeros_like(k), config=VLAConfig.exact(normalize_output=False)
    )
    assert torch.allclose(o, ref) and torch.allclose(S, S_ref)
    o0, S0 = gated_delta_rule(q, k, v, torch.zeros(2, 9, 3, dtype=torch.float64))
    assert S0.abs().max() == 0 and o0.abs().max() == 0  # β = 0 writes nothing


def test_lr_schedule_warms_up_then_decays():
    cfg = TrainConfig(steps=100, lr=1.0, warmup_fraction=0.1, min_lr_fraction=0.1)
    lrs = [lr_at(s, cfg) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in itertools.pairwise(lrs[9:]))
    assert lrs[-1] == pytest.approx(0.1, abs=1e-3)


@pytest.mark.parametrize("mixer", MIXERS)
@pytest.mark.parametrize("task", [MQARTask(3, 12, 24), CopyTask(5, 24)], ids=["mqar", "copy"])
def test_every_mixer_trains_on_every_task(mixer, task):
    torch.manual_seed(0)
    model = Backbone(ModelConfig(mixer=mixer, **TINY))
    out = train(model, task, STEPS, seed=0)
    assert loss_fell(out["losses"]), out["losses"]
    assert 0 <= out["test_accuracy"] <= 1


# -- the state-norm probe ----------------------------------------------------------------------


@pytest.mark.parametrize("mixer", ["vla", "linear", "deltanet"])
def test_probe_segments_equal_one_full_pass(mixer):
    torch.manual_seed(1)
    model = Backbone(ModelConfig(mixer=mixer, **TINY)).double()
    T = 45  # crosses two nudge periods of 20
    out = probe.state_norms(model, T, seed=0, count=6)
    assert out["t"][-1] == T and len(out["layers"]) == 2
    tokens = torch.as_tensor(probe.probe_tokens(T, 24, 0))
    x = model.embed(tokens)
    with torch.no_grad():
        for layer, block in zip(out["layers"], model.blocks, strict=True):
            _, state = block.attn.run_mixer(block.attn.mixer_inputs(block.ln_attn(x)))
            S = state if mixer == "deltanet" else state[0]
            full = torch.linalg.matrix_norm(S[0]).tolist()
            assert np.allclose(layer["heads"][-1], full, rtol=1e-10)
            x = block(x)


def test_probe_untrained_linear_state_outgrows_vla():
    torch.manual_seed(0)
    cfg = dict(vocab=128, d_model=32, n_heads=2, d_ffn=32)
    norms = {
        m: probe.state_norms(Backbone(ModelConfig(mixer=m, **cfg)), 400, count=4)["layers"][0]
        for m in ("linear", "vla")
    }
    assert norms["linear"]["mean"][-1] > 10 * norms["vla"]["mean"][-1]
    assert norms["linear"]["mean"][-1] > 2 * norms["linear"]["mean"][-3]  # still growing


# -- runner, results, report, command line -----------------------------------------------------


def test_runner_caches_resumes_and_reports(tmp_path, capsys):
    jobs = grid_jobs("tiny", mixers=("softmax",), train={"steps": 20})
    copy_jobs = [j for j in jobs if j.task == "copy"]
    first = run_grid(copy_jobs[:2], tmp_path, show_progress=False)
    assert (first["ran"], first["pending"]) == (2, 0)
    again = run_grid(copy_jobs, tmp_path, show_progress=False)
    assert (again["done_before"], again["ran"]) == (2, 1)  # resumed: only the third seed ran
    data = json.loads(next((tmp_path / "tiny").glob("copy-*-s0-*.json")).read_text())
    assert data["job"]["seed"] == 0 and data["provenance"]["torch"] == torch.__version__
    assert data["backends"] == ["sdpa", "sdpa"] and len(data["losses"]) == 20

    from vla_verify.experiments.cli import main

    assert (
        main(
            [
                "list",
                "--grid",
                "tiny",
                "--mixers",
                "softmax",
                "--results",
                str(tmp_path),
                "--train",
                "steps=20",
            ]
        )
        == 0
    )
    assert "3/6 done" in capsys.readouterr().out
    assert main(["report", "--results", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    (cell,) = summary["cells"]
    assert cell["seeds"] == [0, 1, 2] and len(cell["values"]) == 3
    assert summary["figures"]["mqar_n24.vla"] is None
    text = (tmp_path / "results.md").read_text()
    assert "| 6 |" in text and "mqar_n24.vla | 1.000 | — |" in text


def test_a_paused_and_resumed_run_equals_one_sitting(tmp_path):
    """Paused after its first step (a deadline already past) and resumed, a run gives the
    losses, weights and accuracy of the same run in one sitting; a stale checkpoint of another
    run length is refused, and a finished run leaves no checkpoint."""
    task = MQARTask(3, 12, 24)

    def model():
        torch.manual_seed(0)
        return Backbone(ModelConfig(mixer="vla", **TINY))

    whole = model()
    one = train(whole, task, STEPS, seed=0)
    ckpt = tmp_path / "job.pt"
    split = model()
    with pytest.raises(TrainingPaused) as info:
        train(split, task, STEPS, seed=0, checkpoint=ckpt, deadline=0.0)
    assert info.value.step == 1 and ckpt.is_file()
    with pytest.raises(ConfigError) as bad:
        train(model(), task, TrainConfig(steps=31, batch_size=16), seed=0, checkpoint=ckpt)
    assert bad.value.argument == "checkpoint"
    resumed = model()  # a fresh process would rebuild the model, then load the checkpoint
    two = train(resumed, task, STEPS, seed=0, checkpoint=ckpt)
    assert two["losses"] == one["losses"] and two["sittings"] == 2
    assert two["test_accuracy"] == one["test_accuracy"]
    for a, b in zip(whole.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b)
    assert not ckpt.exists()
    with pytest.raises(ConfigError) as no_file:
        train(model(), task, STEPS, seed=0, deadline=0.0)
    assert no_file.value.argument == "deadline"


def test_runner_pauses_a_job_at_the_budget_and_resumes_it(tmp_path):
    from vla_verify.experiments.runner import checkpoint_path

    (job,) = [
        j for j in grid_jobs("tiny", mixers=("softmax",), train={"steps": 400}) if j.task == "copy"
    ][:1]
    first = run_grid([job], tmp_path, time_budget_s=0.5, show_progress=False)
    assert (first["ran"], first["paused"], first["pending"]) == (0, 1, 1), first
    assert checkpoint_path(tmp_path, job).is_file()
    second = run_grid([job], tmp_path, show_progress=False)
    assert (second["ran"], second["pending"]) == (1, 0)
    data = json.loads(next((tmp_path / "tiny").glob("copy-*.json")).read_text())
    assert data["sittings"] == 2 and len(data["losses"]) == 400
    assert not checkpoint_path(tmp_path, job).exists()


def test_import_needs_no_torch():
    code = (
        "import sys, vla_verify.experiments, vla_verify.experiments.results, "
        "vla_verify.experiments.grids, vla_verify.experiments.cli, "
        "vla_verify.proofs.claims.c10_recall; "
        "assert 'torch' not in sys.modules and 'matplotlib' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_worker_pool_runs_jobs_in_spawned_processes_and_honours_the_budget(tmp_path):
    jobs = [
        j for j in grid_jobs("tiny", mixers=("softmax",), train={"steps": 20}) if j.task == "copy"
    ][:2]
    spent = run_grid(jobs, tmp_path, time_budget_s=1e-9, show_progress=False)
    assert (spent["ran"], spent["pending"]) == (0, 2)  # the budget passed before any job
    pooled = run_grid(jobs, tmp_path, workers_per_device=2, show_progress=False)
    assert (pooled["ran"], pooled["failed"], pooled["pending"]) == (2, 0, 0), pooled
    assert pooled["slots"] == 2


def test_grids_cover_the_paper_figures_with_unique_keys():
    from vla_verify.experiments.results import C10_FIGURES

    c10 = grid_jobs("c10", lrs=(1e-3,))
    assert len({j.key() for j in c10}) == len(c10)
    for grid, params, mixer in C10_FIGURES.values():
        seeds = {
            j.seed
            for j in c10
            if j.grid == grid
            and j.mixer == mixer
            and all(j.task_params.get(k) == v for k, v in params.items())
        }
        assert seeds == {0, 1, 2}
    capacity = {j.task_params["n_pairs"] for j in grid_jobs("mqar")}
    assert min(capacity) == 4 and max(capacity) == 64  # n from 4 to 2·d_h
    assert max(j.task_params["seq_len"] for j in grid_jobs("mqar_length")) == 2048
    softmax = [j.model for j in grid_jobs("mqar", sizes=(24,)) if j.mixer == "softmax"]
    assert {json.dumps(m, sort_keys=True) for m in softmax} == {
        json.dumps(RECIPE, sort_keys=True),
        json.dumps({**RECIPE, "positions": True}, sort_keys=True),
    }
    # Every job's task fits its model's vocabulary (n = 64 needs more than 128 tokens).
    for name in ("mqar", "mqar_length", "copy", "c10", "small", "tiny", "state_norm"):
        for job in grid_jobs(name, seeds=(0,), lrs=(1e-3,)):
            task = make_task(job.task, **job.task_params)
            assert task.vocab <= ModelConfig(mixer=job.mixer, **job.model).vocab, job.key()
    bare = grid_jobs("mqar", sizes=(24,), model={"short_conv": 0, "embedding_std": None})
    assert all(j.model["short_conv"] == 0 and j.model["embedding_std"] is None for j in bare)


def test_embedding_std_sets_the_initial_logit_scale_and_bad_values_are_refused():
    torch.manual_seed(0)
    tokens = torch.randint(0, 128, (4, 32))
    default = Backbone(ModelConfig(mixer="linear"))(tokens)
    small = Backbone(ModelConfig(mixer="linear", embedding_std=0.02, positions=True))
    assert float(small.embedding.weight.std()) == pytest.approx(0.02, rel=0.1)
    assert small.position is not None
    assert float(small.position.weight.std()) == pytest.approx(0.02, rel=0.1)
    # N(0, 1) tied embeddings give logits of std ≈ √d_model; 0.02 gives logits near zero.
    assert float(default.std()) > 5.0
    assert float(small(tokens).std()) < 0.5
    for bad in (0.0, -0.1, True):
        with pytest.raises(ConfigError) as info:
            ModelConfig(embedding_std=bad)
        assert info.value.argument == "embedding_std"


def test_short_conv_is_causal_of_its_width_and_bad_widths_are_refused():
    from vla_verify.experiments.model import ShortConvolution

    torch.manual_seed(0)
    conv = ShortConvolution(3, 4)
    x = torch.randn(2, 10, 3, requires_grad=True)
    conv(x)[0, 5].sum().backward()
    assert x.grad is not None
    reads = (x.grad[0].abs().sum(-1) > 0).nonzero().flatten().tolist()
    assert reads == [2, 3, 4, 5]  # tokens t − 3 … t, nothing later
    # In a layer, a later token changes no earlier output.
    layer = Backbone(ModelConfig(mixer="deltanet", short_conv=4, **TINY))
    tokens = torch.randint(2, 24, (1, 12))
    changed = tokens.clone()
    changed[0, 8] = (tokens[0, 8] + 1 - 2) % 22 + 2
    with torch.no_grad():
        a, b = layer(tokens), layer(changed)
    assert torch.equal(a[0, :8], b[0, :8]) and not torch.equal(a[0, 8:], b[0, 8:])
    assert ModelConfig(short_conv=0).short_conv == 0
    for bad in (-1, 2.0, True):
        with pytest.raises(ConfigError) as info:
            ModelConfig(short_conv=bad)
        assert info.value.argument == "short_conv"


def test_a_table_cell_names_what_its_setting_sets_apart():
    from vla_verify.experiments.report import _fmt

    cell = {
        "mean": 0.5,
        "std": 0.1,
        "values": [0.4, 0.5, 0.6],
        "setting": {
            "model": {"positions": True, "short_conv": 4, "embedding_std": 0.02},
            "train": {"steps": 4000},
        },
    }
    assert _fmt(cell) == (
        "0.500 ± 0.100 (3) [positions, short conv 4, embedding std 0.02, 4000 steps]"
    )
    assert _fmt({**cell, "setting": {}}) == "0.500 ± 0.100 (3)"
    assert _fmt(None) == "—"
