"""``deepspeed.utils.safe_get_local_grad``/``safe_set_local_grad`` and the norms DeepSpeed's ZeRO
optimizers carry (``_get_norm_groups()``, ``_global_grad_norm``), on one rank."""

from __future__ import annotations

import pytest
import torch

from ds.full.compat import deepspeed
from ds.full.compat.deepspeed import utils as U


@pytest.mark.parametrize("stage", [1, 3])
def test_local_grad_is_what_the_step_reads(stage: int) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    ref = [p.detach().clone().requires_grad_() for p in model.parameters()]
    cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": stage},
           "gradient_clipping": 0.0, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}}  # fmt: skip
    engine, optimizer, *_ = deepspeed.initialize(model=model, config=cfg)
    x = torch.randn(1, 4)
    engine.backward(engine(x).sum())
    # the same gradients by hand
    torch.nn.functional.linear(
        torch.nn.functional.linear(x, ref[0], ref[1]), ref[2], ref[3]
    ).sum().backward()
    params = list(engine.module.parameters())
    for p, r in zip(params, ref):
        torch.testing.assert_close(U.safe_get_local_grad(p), r.grad.reshape(-1))
    whole = torch.cat([r.grad.reshape(-1) for r in ref]).norm()
    (norm,) = optimizer._get_norm_groups()
    torch.testing.assert_close(norm, whole)
    U.safe_set_local_grad(params[0], torch.zeros(12))  # the first weight's gradient dropped
    (after,) = optimizer._get_norm_groups()
    want = torch.cat([r.grad.reshape(-1) for r in ref[1:]]).norm()
    torch.testing.assert_close(after, want)
    engine.step()
    assert optimizer._global_grad_norm == pytest.approx(float(want), rel=1e-5)
    with pytest.raises(ValueError, match="elements"):
        engine.backward(engine(x).sum())
        U.safe_set_local_grad(params[0], torch.zeros(5))


def test_offloaded_host_gradients_accumulate_over_micro_steps() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2,
           "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
           "optimizer": {"type": "Adam", "params": {"lr": 1e-3}}}  # fmt: skip
    engine, optimizer, *_ = deepspeed.initialize(model=model, config=cfg)
    host = optimizer.accumulated_grads_in_cpu  # DeepSpeed's name: group -> host gradient
    seen = []
    for x in (torch.ones(1, 4), 2 * torch.ones(1, 4)):
        engine.backward(engine(x).sum())
        (grad,) = host.values()
        assert grad.device.type == "cpu"
        seen.append(grad.clone())
    # d(sum(Wx + b)) over 2 micro-steps, each divided by 2: W by x/2, b by 1/2
    torch.testing.assert_close(seen[0][:10], torch.full((10,), 0.5))
    torch.testing.assert_close(seen[1][:10], torch.tensor([1.5] * 8 + [1.0] * 2))
