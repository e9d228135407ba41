"""``optimizer.params.adam_w_mode`` (DeepSpeed's key): for type "Adam", False is Adam with L2 decay
added to the gradient and True (the default) decoupled AdamW; type "AdamW" is always decoupled.
Checked on the host flat optimizer and on the offloaded kernel-provider one against float64
torch.optim.Adam / AdamW on the same model and data (1e-5)."""

from __future__ import annotations

import copy

import pytest
import torch

from ds.accel import get_accelerator
from ds.ops.provider import CpuKernelProvider
from ds.zero.engine import ZeroEngine

LR, WD = 1e-2, 0.1


def _reference(model: torch.nn.Module, decoupled: bool, batches: list[torch.Tensor]) -> list:
    ref = copy.deepcopy(model).double()
    cls = torch.optim.AdamW if decoupled else torch.optim.Adam
    opt = cls(ref.parameters(), lr=LR, weight_decay=WD)
    for x in batches:
        ref(x.double()).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    return [p.detach() for p in ref.parameters()]


@pytest.mark.parametrize("offload", [False, True])
@pytest.mark.parametrize(
    ("kind", "adam_w_mode"), [("Adam", False), ("Adam", True), ("AdamW", False), ("Adam", None)]
)
def test_adam_w_mode_picks_l2_or_decoupled_decay(
    kind: str, adam_w_mode: bool | None, offload: bool
) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 3))
    batches = [torch.randn(4, 6) for _ in range(3)]
    params: dict[str, object] = {"lr": LR, "weight_decay": WD}
    if adam_w_mode is not None:
        params["adam_w_mode"] = adam_w_mode
    zero: dict[str, object] = {"stage": 2}
    if offload:
        zero["offload_optimizer"] = {"device": "cpu"}
    cfg = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_clipping": 0.0,
        "optimizer": {"type": kind, "params": params},
        "zero_optimization": zero,
    }
    decoupled = kind == "AdamW" or adam_w_mode is not False
    want = _reference(model, decoupled, batches)
    other = _reference(model, not decoupled, batches)
    engine = ZeroEngine(model, cfg, kernels=CpuKernelProvider(), accelerator=get_accelerator())
    for x in batches:
        engine.backward(engine(x).pow(2).mean())
        engine.step()
    engine.synchronize_parameters()
    got = [p.detach().double() for p in engine.module.parameters()]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-5)
    # The two decays end apart by far more than the tolerance: the mode really was chosen.
    assert max(float((g - o).abs().max()) for g, o in zip(got, other)) > 1e-4
