"""Stage 3 driven by the engine in one process: accumulation, clipping, bf16 from ds.zero.Init."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

import ds.zero
from ds.zero.engine import ZeroEngine


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 32)
        self.b = nn.Linear(32, 32)
        self.c = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.tanh(self.b(torch.tanh(self.a(x))))).pow(2).mean()


def _config(**zero: Any) -> dict[str, Any]:
    return {
        "train_batch_size": 8,
        "train_micro_batch_size_per_gpu": 4,
        "gradient_clipping": 0.05,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}},
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 32, **zero},
    }


def test_accumulation_and_clipping_match_adamw() -> None:
    torch.manual_seed(0)
    ref = MLP()
    model = copy.deepcopy(ref)
    engine = ZeroEngine(model, _config())
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
    for step in range(6):
        x = torch.randn(8, 8, generator=torch.Generator().manual_seed(step))
        for half in (x[:4], x[4:]):
            engine.backward(engine(half))
            engine.step()
        opt.zero_grad()
        (0.5 * ref(x[:4]) + 0.5 * ref(x[4:])).backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.05)
        opt.step()
    assert engine.global_steps == 6
    full = engine.strategy.consolidated_state_dict()  # type: ignore[attr-defined]
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(full[k], v, rtol=1e-5, atol=1e-6)


def test_bf16_from_init_tracks_fp32() -> None:
    torch.manual_seed(1)
    with ds.zero.Init():
        model = MLP()
    torch.manual_seed(1)
    ref = MLP()
    cfg = {**_config(), "bf16": {"enabled": True}}
    engine = ZeroEngine(model, cfg)
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    for step in range(8):
        x = torch.randn(8, 8, generator=torch.Generator().manual_seed(step))
        for half in (x[:4], x[4:]):
            loss = engine(half.bfloat16())
            engine.backward(loss)
            engine.step()
        opt.zero_grad()
        second = ref(x[4:])
        (0.5 * ref(x[:4]) + 0.5 * second).backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.05)
        opt.step()
        # Same micro-batch, weights of the same step: bf16 (8 mantissa bits) tracks fp32 within
        # 10% + 5e-4 over these steps.
        want = float(second.detach())
        assert abs(float(loss.detach()) - want) <= 0.1 * want + 5e-4
    report = engine.memory_report()
    assert report.master_weight_bytes > 0  # fp32 masters kept beside the bf16 shards


def test_empty_partition_cache_frees_persistent_parameters_and_training_goes_on() -> None:
    torch.manual_seed(2)
    ref = MLP()
    engine = ZeroEngine(copy.deepcopy(ref), _config(stage3_param_persistence_threshold=10**6))
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
    x = torch.randn(8, 8, generator=torch.Generator().manual_seed(0))
    for step in range(3):
        for half in (x[:4], x[4:]):
            engine.backward(engine(half))
            engine.step()
        if step == 1:
            params = list(engine.module.parameters())
            assert all(p.ds_persist for p in params) and all(p.numel() for p in params)
            engine.empty_partition_cache()
            assert sum(p.numel() for p in params) == 0
        opt.zero_grad()
        (0.5 * ref(x[:4]) + 0.5 * ref(x[4:])).backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.05)
        opt.step()
    # gathered again by the next forward, and the updates went on as in plain PyTorch
    assert all(p.numel() for p in engine.module.parameters())
    full = engine.strategy.consolidated_state_dict()  # type: ignore[attr-defined]
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(full[k], v, rtol=1e-5, atol=1e-6)
    ZeroEngine(
        nn.Linear(2, 2), {**_config(), "zero_optimization": {"stage": 2}}
    ).empty_partition_cache()
