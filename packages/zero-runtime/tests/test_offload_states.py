"""``engine.offload_states()`` / ``reload_states()``: the chosen states leave their storage (every
holder re-pointed, so nothing keeps the old memory alive), the engine refuses a forward meanwhile,
and training after the reload equals training that never offloaded, at every stage."""

from __future__ import annotations

import gc
from typing import Any

import pytest
import torch
from _batches import regression_batches

from ds.interfaces.errors import ConfigError
from ds.ops.provider import CpuKernelProvider
from ds.zero.engine import ZeroEngine
from ds.zero.offload_states import (
    OffloadDeviceEnum,
    OffloadStateTypeEnum,
    StatesOffloadedError,
    _by_type,
)


def _engine(stage: int, precision: str = "fp32", **zero: Any) -> ZeroEngine:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 3))
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
        "zero_optimization": {"stage": stage, "reduce_bucket_size": 40, **zero},
    }
    if precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    return ZeroEngine(model, cfg, kernels=CpuKernelProvider())


def _train(engine: ZeroEngine, micro_batches: int, seed: int) -> None:
    """``micro_batches`` forward/backward/step calls (2 make one optimizer step)."""
    for x, y in regression_batches(micro_batches, seed):
        out = engine(x.to(next(engine.module.parameters()).dtype))
        engine.backward(torch.nn.functional.mse_loss(out.float(), y))
        engine.step()


def _weights(engine: ZeroEngine) -> dict[str, torch.Tensor]:
    if engine.zero_optimization_stage() == 3:
        return engine.strategy.consolidated_state_dict()  # type: ignore[attr-defined,no-any-return]
    engine.synchronize_parameters()
    return {k: v.clone() for k, v in engine.module.state_dict().items()}


def _storage_refs(engine: ZeroEngine, types: list[str]) -> list[Any]:
    chosen = _by_type(engine)
    refs = {}
    for name in types:
        for t in chosen[name]:
            st = t.untyped_storage()
            if st.nbytes():
                refs[st.data_ptr()] = st._weak_ref()
    return list(refs.values())


CASES = [(0, "fp32"), (1, "fp32"), (2, "fp32"), (2, "bf16"), (3, "fp32"), (3, "bf16")]


@pytest.mark.parametrize(("stage", "precision"), CASES)
def test_offload_then_reload_keeps_training_identical(stage: int, precision: str) -> None:
    ref, engine = _engine(stage, precision), _engine(stage, precision)
    # Two optimizer steps and a half: the next step's first micro-batch gradients are held too.
    for run in (ref, engine):
        _train(run, 5, seed=1)
    every = [t.value for t in OffloadStateTypeEnum]
    refs = _storage_refs(engine, every)
    assert refs  # the run holds states of several kinds
    engine.offload_states()
    gc.collect()
    # Every holder now points at the host copy: nothing keeps the old storages alive.
    assert all(torch.UntypedStorage._expired(r) for r in refs)
    with pytest.raises(StatesOffloadedError, match=r"call engine.reload_states\(\)"):
        engine(torch.randn(4, 6))
    engine.reload_states()
    for run in (ref, engine):
        _train(run, 5, seed=3)
    want, got = _weights(ref), _weights(engine)
    for name, value in want.items():
        assert torch.equal(got[name], value), name
    # The optimizer's state is the same too (the moments moved and came back bit for bit).
    a, b = ref.optimizer.state_dict()["state"], engine.optimizer.state_dict()["state"]
    for i, st in a.items():
        for k, v in st.items():
            assert torch.equal(torch.as_tensor(b[i][k]), torch.as_tensor(v)), (i, k)


def test_include_moves_only_the_named_states() -> None:
    engine = _engine(2)
    _train(engine, 2, seed=1)
    moments = _storage_refs(engine, ["optim_states"])
    params = [p.untyped_storage().data_ptr() for p in engine.module.parameters()]
    masters = [p.untyped_storage().data_ptr() for p in engine.optimizer.param_groups[0]["params"]]
    engine.offload_states(include=[OffloadStateTypeEnum.optim_states], device=OffloadDeviceEnum.cpu)
    gc.collect()
    assert moments and all(torch.UntypedStorage._expired(r) for r in moments)
    assert [p.untyped_storage().data_ptr() for p in engine.module.parameters()] == params
    assert [
        p.untyped_storage().data_ptr() for p in engine.optimizer.param_groups[0]["params"]
    ] == masters
    engine.reload_states()
    engine.reload_states()  # nothing left to bring back: a no-op
    _train(engine, 2, seed=2)


def test_bad_calls_are_refused_with_the_fix() -> None:
    engine = _engine(1)
    with pytest.raises(ConfigError, match=r"include=\.\.\.\) got \['moments'\]; use"):
        engine.offload_states(include=["moments"])
    with pytest.raises(ConfigError, match=r"device='nvme'.*use device=OffloadDeviceEnum.cpu"):
        engine.offload_states(device=OffloadDeviceEnum.nvme)
    engine.offload_states(device="none")  # DeepSpeed warns and does nothing
    engine(torch.randn(4, 6))
    offloaded = _engine(2, offload_optimizer={"device": "cpu"})
    with pytest.raises(ConfigError, match="already live on the host"):
        offloaded.offload_states()
