"""bf16 gradients accumulate in fp32 by default; ``data_types.grad_accum_dtype`` chooses.

Sixteen micro-steps whose bf16 gradients are each a small addition to a large running sum: a
bf16 accumulator rounds most of them away; the fp32 one holds the exact fp32 sum of the bf16
gradients, as DeepSpeed's bf16 optimizer does.
"""

from __future__ import annotations

import pytest
import torch

from ds.zero.engine import ZeroEngine

MICRO = 16


def _accumulated(stage: int, extra: dict) -> tuple[torch.Tensor, torch.Tensor, torch.dtype]:  # type: ignore[type-arg]
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4, bias=False)
    cfg = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": MICRO,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": stage},
        **extra,
    }
    engine = ZeroEngine(model, cfg)
    expected = torch.zeros(4, 8, dtype=torch.float32)
    for i in range(MICRO):
        # First a large gradient, then small ones: 1 + 15 * 2**-9 is not a bf16 sum.
        scale = 1.0 if i == 0 else 2.0**-9
        x = torch.full((1, 8), scale, dtype=torch.bfloat16)
        w = engine.module.weight
        grad = torch.autograd.grad((engine.module(x) * 1.0).sum(), w, retain_graph=False)[0]
        expected += grad.float() / MICRO
        engine.backward(engine.module(x).sum())
    group = engine.strategy.groups[0]  # type: ignore[attr-defined]
    acc = group.flat_grad[: expected.numel()].view(4, 8).clone()
    dtype = group.flat_grad.dtype
    engine.destroy()
    return acc, expected, dtype


@pytest.mark.parametrize("stage", [0, 1])
def test_bf16_grads_accumulate_in_fp32_by_default(stage: int) -> None:
    acc, expected, dtype = _accumulated(stage, {})
    assert dtype == torch.float32
    torch.testing.assert_close(acc, expected, rtol=0, atol=1e-7)


def test_grad_accum_dtype_bf16_is_honoured_and_loses_the_small_steps() -> None:
    acc, expected, dtype = _accumulated(0, {"data_types": {"grad_accum_dtype": "bf16"}})
    assert dtype == torch.bfloat16
    assert (acc.float() - expected).abs().max() > 1e-3
