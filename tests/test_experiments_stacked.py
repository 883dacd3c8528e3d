"""A stack of backbones trains each member as it would train alone (vla_verify.experiments.stacked).

The reference here is independent of the stacked code: single :class:`Backbone` s through
``torch.optim.AdamW`` and ``torch.nn.utils.clip_grad_norm_``, in float64, where the two agree to
rounding.  Planted bugs (members coupled, one learning rate for all, clipping over the whole
stack) must break the agreement.
"""

from __future__ import annotations

import json

import pytest

from vla_verify.errors import ConfigError
from vla_verify.experiments.grids import Job, grid_jobs
from vla_verify.experiments.tasks import CopyTask, MQARTask

torch = pytest.importorskip("torch")

from vla_verify.experiments import stacked as stacked_module  # noqa: E402
from vla_verify.experiments.model import Backbone, ModelConfig  # noqa: E402
from vla_verify.experiments.runner import checkpoint_path, run_grid, stacks  # noqa: E402
from vla_verify.experiments.stacked import StackedBackbone, clip_grad_norms  # noqa: E402
from vla_verify.experiments.train import (  # noqa: E402
    TrainConfig,
    TrainingPaused,
    _loss,
    loss_fell,
    lr_at,
    train_members,
    train_stacked,
)

TINY = dict(vocab=24, d_model=16, n_heads=2, d_ffn=32)
STEPS = TrainConfig(steps=12, batch_size=8, lr=1e-2, eval_samples=16, eval_batch=16)
SEEDS = (0, 1, 2)
LRS = (1e-2, 3e-3, 2e-2)


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def members(config: ModelConfig, seeds=SEEDS) -> list[Backbone]:
    out = []
    for seed in seeds:
        torch.manual_seed(seed)
        out.append(Backbone(config).double())
    return out


def train_alone(model: Backbone, task, config: TrainConfig, seed: int, lr: float) -> list[float]:
    """The recipe of train.py written out for one backbone with torch's own optimiser."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": config.weight_decay},
            {"params": rest, "weight_decay": 0},
        ],
        lr=lr,
    )
    scaled = TrainConfig(**{**config.to_dict(), "lr": lr})
    losses = []
    for step in range(config.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, scaled)
        data = task.batch(config.batch_size, seed, step)
        loss = _loss(model, torch.as_tensor(data.tokens), torch.as_tensor(data.targets))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        opt.step()
        losses.append(float(loss.detach()))
    return losses


CONFIGS = {
    "vla": dict(mixer="vla", short_conv=3),
    "deltanet": dict(mixer="deltanet", short_conv=4, embedding_std=0.02),
    "softmax": dict(mixer="softmax", positions=True, max_len=32),
    "linear": dict(mixer="linear"),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_stacked_logits_are_each_members_logits(name):
    config = ModelConfig(**TINY, **CONFIGS[name])
    models = members(config)
    stack = StackedBackbone(models)
    tokens = torch.stack(
        [torch.as_tensor(MQARTask(3, 14, 24).batch(4, seed, 0).tokens) for seed in SEEDS]
    )
    with torch.no_grad():
        got = stack(tokens)
        for m, model in enumerate(models):
            torch.testing.assert_close(got[m], model(tokens[m]), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["vla", "deltanet", "softmax"])
def test_a_stack_trains_each_member_as_alone(name):
    """Losses and weights after training with three seeds and three learning rates equal
    those of each backbone trained alone by torch's AdamW and clipping (float64)."""
    config = ModelConfig(**TINY, **CONFIGS[name])
    task = MQARTask(3, 14, 24)
    alone = members(config)
    expected = [
        train_alone(model, task, STEPS, seed, lr)
        for model, seed, lr in zip(alone, SEEDS, LRS, strict=True)
    ]
    together = members(config)
    results = train_members(together, task, STEPS, seeds=SEEDS, lrs=LRS)
    for result, losses, a, b in zip(results, expected, alone, together, strict=True):
        assert result["stack"] == 3 and not result["diverged"]
        assert result["losses"] == pytest.approx(losses, rel=1e-10)
        for p, q in zip(a.parameters(), b.parameters(), strict=True):
            torch.testing.assert_close(p, q, rtol=1e-9, atol=1e-12)


def test_clipping_is_per_member_and_matches_torch():
    """Member 1's large gradient is clipped to norm 1; member 0's small one is left alone."""
    flat_grad = torch.tensor(
        [[0.1, 0.0, 0.0, 0.0, 0.2, 0, 0], [30.0, 0.0, 0.0, 0, 40.0, 0, 0]], dtype=torch.float64
    )
    expected = []
    for m in range(2):
        a = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
        b = torch.nn.Parameter(torch.zeros(4, dtype=torch.float64))
        a.grad, b.grad = flat_grad[m, :3].clone(), flat_grad[m, 3:].clone()
        torch.nn.utils.clip_grad_norm_([a, b], 1.0)
        expected.append(torch.cat([a.grad, b.grad]))
    unclipped = flat_grad.clone()
    torch.testing.assert_close(clip_grad_norms(unclipped, 0.0)[1], torch.tensor(50.0).double())
    assert torch.equal(unclipped, flat_grad)  # grad_clip = 0: no clipping
    norms = clip_grad_norms(flat_grad, 1.0)
    torch.testing.assert_close(norms, torch.tensor([0.05**0.5, 50.0], dtype=torch.float64))
    for m, row in enumerate(expected):
        torch.testing.assert_close(flat_grad[m], row, rtol=1e-15, atol=0)


def _coupled_linear(self, x, name, bias=False):
    """Planted: every member uses member 0's weights."""
    M, B, T, _ = x.shape
    weight = self.param(f"{name}.weight")[:1].expand(M, -1, -1)
    y = torch.bmm(x.reshape(M, B * T, -1), weight.transpose(1, 2))
    if bias:
        y = y + self.param(f"{name}.bias")[:1].unsqueeze(1)
    return y.view(M, B, T, -1)


def _whole_stack_clip(flat_grad, max_norm):
    """Planted: one clipping factor from the norm over the whole stack."""
    norm = flat_grad.square().sum().sqrt()
    flat_grad.mul_((max_norm / (norm + 1e-6)).clamp(max=1.0))
    return norm.expand(flat_grad.shape[0])


class _OneLearningRate(stacked_module.StackedAdamW):
    """Planted: member 0's learning rate for every member."""

    def step(self):  # type: ignore[no-untyped-def]
        self.lr.fill_(float(self.lr[0]))
        super().step()


@pytest.mark.parametrize("bug", ["coupled", "clip", "lr"])
def test_planted_stacking_bugs_break_the_agreement(monkeypatch, bug):
    config = ModelConfig(**TINY, **CONFIGS["vla"])
    task = MQARTask(3, 14, 24)
    alone = members(config)
    expected = [
        train_alone(m, task, STEPS, s, lr) for m, s, lr in zip(alone, SEEDS, LRS, strict=True)
    ]
    if bug == "coupled":
        monkeypatch.setattr(StackedBackbone, "_linear", _coupled_linear)
    elif bug == "clip":
        import vla_verify.experiments.train as train_module

        monkeypatch.setattr(train_module, "clip_grad_norms", _whole_stack_clip)
    else:
        import vla_verify.experiments.train as train_module

        monkeypatch.setattr(train_module, "StackedAdamW", _OneLearningRate)
    results = train_members(members(config), task, STEPS, seeds=SEEDS, lrs=LRS)
    worst = max(
        max(abs(a - b) / abs(b) for a, b in zip(r["losses"], e, strict=True))
        for r, e in zip(results, expected, strict=True)
    )
    assert worst > 1e-6


class _Frozen(StackedBackbone):
    """Planted: its logits are cut from its parameters, which then receive no gradient."""

    def forward(self, tokens):  # type: ignore[no-untyped-def]
        return super().forward(tokens).detach().requires_grad_()


def test_loss_check_rejects_a_stack_that_does_not_learn():
    config = ModelConfig(**TINY, mixer="softmax")
    models = members(config, seeds=(0,))
    frozen = _Frozen(models)
    before = {n: frozen.param(n).detach().clone() for n in frozen.names}
    steps = TrainConfig(steps=30, batch_size=16, lr=1e-2)
    (out,) = train_stacked(frozen, MQARTask(3, 12, 24), steps, seeds=[0])
    assert not loss_fell(out["losses"])
    # AdamW's weight decay still shrinks the matrices; nothing else moves them.
    for name in frozen.names:
        if frozen.param(name).ndim < 3:
            assert torch.equal(frozen.param(name), before[name]), name


def test_a_diverged_member_is_retired_and_the_others_train_on():
    """Member 1's learning rate is absurd: its loss or gradient stops being finite; it is
    reported diverged with the losses it had, and member 0 trains as it would alone."""
    config = ModelConfig(**TINY, mixer="vla")
    task = MQARTask(3, 14, 24)
    steps = TrainConfig(steps=12, batch_size=8, lr=1e-2, eval_samples=16, eval_batch=16)
    (alone,) = members(config, seeds=(0,))
    expected = train_alone(alone, task, steps, 0, 1e-2)
    models = members(config, seeds=(0, 1))
    with torch.no_grad():
        models[1].embedding.weight.mul_(float("inf"))  # poisoned from the first step
    results = train_members(models, task, steps, seeds=(0, 1), lrs=(1e-2, 1e-2))
    assert results[1]["diverged"] and len(results[1]["losses"]) < steps.steps
    assert not results[0]["diverged"]
    assert results[0]["losses"] == pytest.approx(expected, rel=1e-10)


def test_a_paused_stack_resumes_to_the_same_weights(tmp_path):
    config = ModelConfig(**TINY, mixer="vla")
    task = CopyTask(5, 24)
    whole = members(config)
    one = train_members(whole, task, STEPS, seeds=SEEDS, lrs=LRS)
    ckpt = tmp_path / "stack.pt"
    with pytest.raises(TrainingPaused):
        train_members(members(config), task, STEPS, seeds=SEEDS, lrs=LRS, checkpoint=ckpt,
                      deadline=0.0)  # fmt: skip
    with pytest.raises(ConfigError) as other_seeds:
        train_members(members(config), task, STEPS, seeds=(2, 1, 0), lrs=LRS, checkpoint=ckpt)
    assert other_seeds.value.argument == "checkpoint"
    resumed = members(config)
    two = train_members(resumed, task, STEPS, seeds=SEEDS, lrs=LRS, checkpoint=ckpt)
    for a, b in zip(one, two, strict=True):
        assert a["losses"] == b["losses"] and b["sittings"] == 2
        assert a["test_accuracy"] == b["test_accuracy"]
    for a, b in zip(whole, resumed, strict=True):
        for p, q in zip(a.parameters(), b.parameters(), strict=True):
            assert torch.equal(p, q)
    assert not ckpt.exists()


@pytest.mark.parametrize("N", [8, 6 * 2048, 64 * 1024 + 64])
def test_the_sliced_weight_gradient_is_the_product(N):
    """The weight gradient reduced in slices (``_weight_gradient``: 1, 4 and 32 slices here)
    equals ``dyᵀ x`` in float64 to rounding, and the product's backward is the exact one."""
    gen = torch.Generator().manual_seed(N)
    dy = torch.randn(2, N, 5, dtype=torch.float64, generator=gen)
    x = torch.randn(2, N, 3, dtype=torch.float64, generator=gen)
    got = stacked_module._weight_gradient(dy, x)
    want = torch.einsum("mno,mni->moi", dy, x)
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12 * N**0.5)
    # A slice dropped from the sum (a planted bug) is caught by the same comparison:
    if N >= 2 * stacked_module._ROWS_PER_SLICE:
        half = stacked_module._weight_gradient(dy[:, : N // 2], x[:, : N // 2])
        assert not torch.allclose(half, want, rtol=1e-6)
    w = torch.randn(2, 5, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    xs = x[:, :7].clone().requires_grad_()
    assert torch.autograd.gradcheck(stacked_module._stacked_product, (xs, w))


def test_a_stack_is_built_where_it_trains():
    (model,) = members(ModelConfig(**TINY, mixer="softmax"), seeds=(0,))
    stack = StackedBackbone([model])
    with pytest.raises(ConfigError):
        stack.float()  # a cast would part the parameters from the optimiser's buffer
    with pytest.raises(ConfigError) as bad:
        StackedBackbone([model, Backbone(ModelConfig(**TINY, mixer="vla"))])
    assert bad.value.argument == "members"


def test_stacks_group_only_what_may_train_together():
    jobs = grid_jobs("tiny", mixers=("softmax", "vla"), lrs=(1e-2, 3e-3))
    formed = stacks(jobs, 4)
    assert sorted(j.key() for s in formed for j in s) == sorted(j.key() for j in jobs)
    for members_ in formed:
        assert len(members_) <= 4 and len({m.group for m in members_}) == 1
    assert stacks(jobs, 4) == formed  # the next run forms the same stacks
    assert all(len(s) == 1 for s in stacks(jobs, 1))
    with pytest.raises(ConfigError):
        stacks(jobs, 0)
    one = jobs[0]
    assert checkpoint_path("r", one).name == f"{one.key()}.pt"
    assert checkpoint_path("r", formed[0]) != checkpoint_path("r", formed[1])


def test_the_runner_trains_stacks_and_writes_each_job(tmp_path):
    jobs = [
        j
        for j in grid_jobs("tiny", mixers=("vla",), lrs=(1e-2, 3e-3), train={"steps": 20})
        if j.task == "copy"
    ]
    out = run_grid(jobs, tmp_path, stack=6, show_progress=False)
    assert (out["ran"], out["failed"], out["pending"], out["stacks"]) == (6, 0, 0, 1), out
    for job in jobs:
        data = json.loads((tmp_path / "tiny" / f"{job.key()}.json").read_text())
        assert data["stack"] == 6 and len(data["stacked_with"]) == 5
        assert data["job"] == job.to_dict() and len(data["losses"]) == 20
    assert isinstance(jobs[0], Job)


def test_a_plan_runs_several_selections_as_one_longest_first(tmp_path, capsys):
    from vla_verify.experiments.cli import main
    from vla_verify.experiments.runner import stack_cost

    plan = tmp_path / "plan.txt"
    plan.write_text(
        "# the copy jobs, then MQAR at two lengths\n"
        "--grid tiny --mixers softmax\n"
        "--grid tiny --mixers vla --train steps=3 eval_samples=8\n"
    )
    argv = [
        "--plan",
        str(plan),
        "--results",
        str(tmp_path),
        "--train",
        "steps=4",
        "eval_samples=16",
    ]
    assert main(["list", *argv]) == 0
    assert "0/12 done" in capsys.readouterr().out
    assert main(["run", *argv, "--stack", "3", "--quiet"]) == 0
    assert "12/12 done" in capsys.readouterr().out
    files = {p.name: json.loads(p.read_text()) for p in (tmp_path / "tiny").glob("*-s*.json")}
    vla = [d for d in files.values() if d["job"]["mixer"] == "vla"]
    assert len(files) == 12 and all(d["train_config"]["steps"] == 3 for d in vla)
    assert all(d["train_config"]["eval_samples"] == 8 for d in vla)
    soft = [d for d in files.values() if d["job"]["mixer"] == "softmax"]
    assert all(d["train_config"]["steps"] == 4 for d in soft)
    (tmp_path / "bad.txt").write_text("--grid nonsense\n")
    assert main(["run", "--plan", str(tmp_path / "bad.txt"), "--results", str(tmp_path)]) == 2
    assert main(["run", "--results", str(tmp_path)]) == 2  # neither --grid nor --plan
    jobs = grid_jobs("tiny", mixers=("vla",))
    ordered = sorted(stacks(jobs, 3), key=stack_cost, reverse=True)
    assert [s[0].task for s in ordered] == ["mqar", "copy"]  # T = 16 before T = 12


def test_plan_lines_run_in_order_and_the_longest_first_within_a_line(tmp_path, monkeypatch):
    from vla_verify.experiments import runner

    started = []
    monkeypatch.setattr(
        runner, "_run_stack", lambda stack, *a: started.append(stack[0]) or "paused: planted"
    )
    first = grid_jobs("tiny", mixers=("softmax",), lrs=(1e-2,))  # mqar T = 16, copy T = 12
    second = grid_jobs("tiny", mixers=("vla",), lrs=(1e-2,))
    line_of = {j.key(): 0 for j in first} | {j.key(): 1 for j in second}
    jobs = second + first  # the listing's order is not the priority
    started.clear()
    run_grid(jobs, tmp_path, stack=3, show_progress=False, priority=lambda j: line_of[j.key()])
    # The worker stops at the first paused stack; run again with each stack left alone:
    monkeypatch.setattr(runner, "_run_stack", lambda stack, *a: started.append(stack[0]))
    started.clear()
    run_grid(jobs, tmp_path, stack=3, show_progress=False, priority=lambda j: line_of[j.key()])
    assert [(j.mixer, j.task) for j in started] == [
        ("softmax", "mqar"), ("softmax", "copy"), ("vla", "mqar"), ("vla", "copy"),
    ]  # fmt: skip
    started.clear()
    run_grid(jobs, tmp_path, stack=3, show_progress=False)  # no priority: the longest first
    assert [j.task for j in started] == ["mqar", "mqar", "copy", "copy"]


def test_a_job_takes_the_result_of_the_same_experiment_in_another_grid(tmp_path, monkeypatch):
    from vla_verify.experiments import runner
    from vla_verify.experiments.runner import adopt_equivalents, result_path

    length = grid_jobs("mqar_length", sizes=(256,), mixers=("vla",), lrs=(1e-3,), seeds=(0, 1))
    capacity = grid_jobs("mqar", sizes=(8,), mixers=("vla",), lrs=(1e-3,), seeds=(0, 1, 2))
    other_n = grid_jobs("mqar", sizes=(16,), mixers=("vla",), lrs=(1e-3,), seeds=(0,))
    longer = grid_jobs("mqar", sizes=(8,), mixers=("vla",), lrs=(1e-3,), train={"steps": 9})
    measured = length[0]
    path = result_path(tmp_path, measured)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"job": measured.to_dict(), "key": measured.key(), "acc": 0.5}))
    adopted = adopt_equivalents(capacity + other_n + longer, tmp_path)
    assert adopted == [capacity[0]]  # seed 0 only: seeds 1, 2, n = 16, 9 steps differ
    copy = json.loads(result_path(tmp_path, capacity[0]).read_text())
    assert copy["job"] == capacity[0].to_dict() and copy["key"] == capacity[0].key()
    assert copy["same_as"] == f"mqar_length/{path.name}" and copy["acc"] == 0.5
    assert adopt_equivalents(capacity, tmp_path) == []  # done: nothing more to take
    # A run takes such results before it trains anything, and counts them:
    result_path(tmp_path, capacity[0]).unlink()
    monkeypatch.setattr(runner, "_run_stack", lambda *a: pytest.fail("nothing to train"))
    out = run_grid(capacity[:1], tmp_path, show_progress=False)
    assert (out["adopted"], out["done_before"], out["pending"], out["stacks"]) == (1, 0, 0, 0)


def test_matmul_precision_is_checked_and_named_in_the_report():
    from vla_verify.experiments.report import _fmt

    with pytest.raises(ConfigError) as bad:
        TrainConfig(matmul_precision="medium")
    assert bad.value.argument == "matmul_precision"
    cell = {"mean": 1.0, "std": 0.0, "values": [1, 1, 1]}
    cell["setting"] = {"model": {}, "train": {"matmul_precision": "high"}}
    assert "TF32 products" in _fmt(cell)
    cell["setting"] = {"model": {}, "train": {}}
    assert "TF32" not in _fmt(cell)
