"""An engine built without an optimizer (no section, none passed), as DeepSpeed accepts for
evaluation and inference: it runs the model forward at every stage, holds no training state, and
whatever would train refuses, naming how to add an optimizer."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from ds.interfaces.errors import ConfigError
from ds.zero.config import load_config
from ds.zero.engine import ZeroEngine
from ds.zero.optim.none import NoOptimizer


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 3))


def _cfg(stage: int, **kw: object) -> dict[str, object]:
    return {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": stage}, **kw}


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_forward_matches_the_model_and_training_refuses(stage: int) -> None:
    model = _model()
    ref = copy.deepcopy(model)
    engine = ZeroEngine(model, _cfg(stage))
    assert isinstance(engine.optimizer, NoOptimizer) and engine.get_lr() == []
    report = engine.memory_report()
    assert report.master_weight_bytes == report.optimizer_state_bytes == 0
    x = torch.randn(5, 6, generator=torch.Generator().manual_seed(1))
    out = engine(x)
    torch.testing.assert_close(out, ref(x), rtol=0, atol=0)
    with pytest.raises(ConfigError, match=r"backward\(\) needs an optimizer.*add an 'optimizer'"):
        engine.backward(out.sum())
    with pytest.raises(ConfigError, match=r"step\(\) needs an optimizer.*pass optimizer="):
        engine.step()
    with pytest.raises(ConfigError, match=r"save_checkpoint\(\).*save_16bit_model"):
        engine.save_checkpoint("/nonexistent")
    with pytest.raises(ConfigError, match=r"optimizer"):
        engine.optimizer.step()
    assert engine.global_steps == 0


def test_stage3_partitions_and_releases_around_forward() -> None:
    model = _model()
    ref = copy.deepcopy(model)
    zero = {"stage": 3, "stage3_param_persistence_threshold": 0}
    engine = ZeroEngine(model, _cfg(3, zero_optimization=zero))
    x = torch.randn(3, 6)
    with torch.no_grad():
        torch.testing.assert_close(engine(x), ref(x))
    assert all(p.data.numel() == 0 for p in model.parameters())  # released after the forward
    assert not engine.strategy.opt._masters  # type: ignore[attr-defined]  # no fp32 copies


def test_a_scheduler_section_is_ignored_with_a_warning() -> None:
    cfg = _cfg(0, scheduler={"type": "WarmupLR", "params": {"warmup_num_steps": 2}})
    with pytest.warns(UserWarning, match="LR scheduler is ignored: the engine has no optimizer"):
        engine = ZeroEngine(_model(), cfg)
    assert engine.lr_scheduler is None


def test_offload_optimizer_needs_no_kernels_without_an_optimizer() -> None:
    zero = {"stage": 2, "offload_optimizer": {"device": "cpu"}}
    engine = ZeroEngine(_model(), _cfg(2, zero_optimization=zero), kernels=None)
    assert isinstance(engine.optimizer, NoOptimizer)


def test_a_config_without_optimizer_loads(tmp_path: Path) -> None:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(_cfg(3)))
    assert load_config(str(path)).optimizer is None
