"""GPU checks before a grid: the kernels the experiments train with agree with the references.

1. fla's ``fused_recurrent_delta_rule`` (``scale=1``) against :func:`gated_delta_rule`
   (float32 and a float64 reference): outputs and the gradients of q, k, v, β.
2. A VLA backbone on ``triton_fused`` against the same weights on the ``torch`` backend: logits
   and every parameter's gradient.
3. A stack of backbones (``vla_verify.experiments.stacked``) against its members run one by one:
   logits of every mixer.
4. Milliseconds per training step of each mixer at the paper's size (B = 64, T = 256): one
   backbone through ``torch.optim.AdamW`` with a sync per step, and per member of stacks of 3
   and 6 with float32 and with TF32 products; per member of a stack of 3 at T = 1024
   (``--no-timings`` skips these).

Writes ``<out>/gpu_check.json``; exits 1 when a comparison exceeds its bound.  The bound is
float32 accumulation over T = 256 steps, ``64 · u32 · T ≈ 1e-3`` relative to the largest entry
(the T = 512 comparison is held to the same bound, a factor 2 stricter).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from vla_verify.experiments.model import Backbone, ModelConfig, gated_delta_rule
from vla_verify.experiments.runner import provenance
from vla_verify.experiments.stacked import StackedBackbone
from vla_verify.experiments.tasks import MQARTask
from vla_verify.experiments.train import TrainConfig, _loss, lr_at, train_stacked

U32 = 2.0**-24


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def check_fla(T: int = 256) -> dict:
    from fla.ops.delta_rule import fused_recurrent_delta_rule

    g = torch.Generator(device="cuda").manual_seed(0)
    shape = (4, T, 4, 32)
    q, k, v = (torch.randn(*shape, device="cuda", generator=g) for _ in range(3))
    q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    beta = torch.rand(4, T, 4, device="cuda", generator=g)
    inputs = [x.double().requires_grad_() for x in (q, k, v, beta)]
    o_ref, _ = gated_delta_rule(*inputs)
    o_ref.square().sum().backward()
    fla_in = [x.detach().float().requires_grad_() for x in inputs]
    o_fla, _ = fused_recurrent_delta_rule(*fla_in, scale=1.0)
    o_fla.square().sum().backward()
    out = {"o": rel(o_fla.double(), o_ref.detach())}
    for name, a, b in zip("qkvb", fla_in, inputs, strict=True):
        out[f"grad_{name}"] = rel(a.grad.double(), b.grad)
    return out


def check_triton(T: int = 256) -> dict:
    torch.manual_seed(0)
    ref = Backbone(ModelConfig(mixer="vla", backend="torch")).cuda()
    fused = Backbone(ModelConfig(mixer="vla", backend="triton_fused")).cuda()
    fused.load_state_dict(ref.state_dict())
    data = MQARTask(24, T).batch(8, 0, 0)
    tokens = torch.as_tensor(data.tokens, device="cuda")
    targets = torch.as_tensor(data.targets, device="cuda")
    out = {}
    for name, model in (("torch", ref), ("triton_fused", fused)):
        loss = _loss(model, tokens, targets)
        loss.backward()
        out[name] = float(loss)
    grads = {
        n: rel(p.grad, q.grad)
        for (n, p), q in zip(fused.named_parameters(), ref.parameters(), strict=True)
    }
    out["worst_grad"] = max(grads.values())
    out["worst_grad_param"] = max(grads, key=grads.get)
    out["loss_rel"] = abs(out["torch"] - out["triton_fused"]) / abs(out["torch"])
    return out


def step_ms(mixer: str, T: int = 256, steps: int = 20) -> float:
    torch.manual_seed(0)
    model = Backbone(ModelConfig(mixer=mixer), "cuda").cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    task, cfg = MQARTask(24, T), TrainConfig()
    times = []
    for step in range(steps + 5):
        data = task.batch(64, 0, step)
        tokens = torch.as_tensor(data.tokens, device="cuda")
        targets = torch.as_tensor(data.targets, device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        loss = _loss(model, tokens, targets)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return 1e3 * sorted(times[5:])[len(times[5:]) // 2]


def check_stacked(T: int = 256) -> dict:
    """Worst relative difference of a stack's logits from its members' own, per mixer."""
    out = {}
    for mixer in ("vla", "deltanet", "softmax", "linear"):
        members = []
        for seed in range(3):
            torch.manual_seed(seed)
            members.append(Backbone(ModelConfig(mixer=mixer, short_conv=4), "cuda").cuda())
        stack = StackedBackbone(members)
        tokens = torch.stack(
            [
                torch.as_tensor(MQARTask(24, T).batch(8, s, 0).tokens, device="cuda")
                for s in range(3)
            ]
        )
        with torch.no_grad():
            got = stack(tokens)
            out[mixer] = max(rel(got[m], model(tokens[m])) for m, model in enumerate(members))
    return out


def stacked_step_ms(
    mixer: str, members: int, T: int = 256, steps: int = 15, precision: str = "highest"
) -> float:
    """Milliseconds of one training step of a stack, per member, with ``precision`` the
    products' (``TrainConfig.matmul_precision``): the difference of a run of ``steps + 5`` and
    a run of 5 steps over ``steps`` (so the stack's set-up and the first steps' compilation and
    uploads do not count), after a 3-step run that warms the kernels up."""
    task = MQARTask(24, T)
    seconds = {}
    for run_steps in (3, 5, steps + 5):
        models = []
        for seed in range(members):
            torch.manual_seed(seed)
            models.append(Backbone(ModelConfig(mixer=mixer, short_conv=4), "cuda").cuda())
        cfg = TrainConfig(steps=run_steps, matmul_precision=precision)
        stack = StackedBackbone(models)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        train_stacked(stack, task, cfg, seeds=list(range(members)), device="cuda")
        torch.cuda.synchronize()
        seconds[run_steps] = time.perf_counter() - t0
    return 1e3 * (seconds[steps + 5] - seconds[5]) / steps / members


def main() -> int:
    out_dir = Path(sys.argv[1])
    timings = "--no-timings" not in sys.argv[2:]
    bound = 64 * U32 * 256
    report: dict = {"provenance": provenance("cuda"), "bound": bound}
    report["fla_vs_gated_delta_rule"] = check_fla()
    report["fla_vs_gated_delta_rule_T512"] = check_fla(512)  # also warms fla's autotune cache
    report["triton_fused_vs_torch"] = check_triton()
    report["stacked_vs_members"] = check_stacked()
    mixers: tuple[str, ...] = ("softmax", "linear", "deltanet", "vla") if timings else ()
    report["step_ms_B64_T256"] = {m: step_ms(m) for m in mixers}
    report["stacked_step_ms_per_member_B64_T256"] = {
        m: {M: stacked_step_ms(m, M) for M in (3, 6)} for m in mixers
    }
    report["stacked_step_ms_per_member_B64_T256_tf32"] = {
        m: {M: stacked_step_ms(m, M, precision="high") for M in (3, 6)} for m in mixers
    }
    report["stacked_step_ms_per_member_B64_T1024_M3"] = (
        {
            p: {m: stacked_step_ms(m, 3, T=1024, steps=8, precision=p) for m in mixers}
            for p in ("highest", "high")
        }
        if timings
        else {}
    )
    worst = max(
        max(report["fla_vs_gated_delta_rule"].values()),
        max(report["fla_vs_gated_delta_rule_T512"].values()),
        report["triton_fused_vs_torch"]["worst_grad"],
        max(report["stacked_vs_members"].values()),
    )
    report["ok"] = bool(worst <= bound)
    (out_dir / "gpu_check.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
