"""ds.full.initialize wires the registry's collaborators into the training engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import ds.full as ds
from ds.interfaces.errors import ConfigError
from ds.interfaces.training import TrainingEngine

CONFIG = {
    "train_batch_size": 4,
    "steps_per_print": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 1e-2, "warmup_num_steps": 4}},
    "zero_optimization": {"stage": 2},
}


def _data() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(2, 8, generator=g)
    xs = [torch.randn(8, generator=g) for _ in range(16)]
    return [(x, w @ x) for x in xs]  # a learnable target


def _train(engine, loader) -> list[float]:  # type: ignore[no-untyped-def]
    losses = []
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
    return losses


def test_initialize_returns_engine_optimizer_loader_scheduler(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(CONFIG))
    engine, optimizer, loader, scheduler = ds.initialize(
        model=model, config=str(path), training_data=_data()
    )
    assert isinstance(engine, TrainingEngine)
    assert optimizer is engine.optimizer
    assert len(loader) == 4 and scheduler is engine.lr_scheduler
    losses = [loss for _ in range(3) for loss in _train(engine, loader)]
    assert engine.global_steps == 12
    assert sum(losses[-4:]) < sum(losses[:4])
    engine.save_checkpoint(str(tmp_path / "ckpt"))
    assert (tmp_path / "ckpt" / "global_step12").is_dir()


def test_offload_steps_through_the_cpu_kernel_provider() -> None:
    model = torch.nn.Linear(8, 2)
    cfg = {**CONFIG, "zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}}}
    engine, optimizer, _, _ = ds.initialize(model=model, config=cfg)
    assert type(optimizer).__name__ == "ProviderAdam"
    assert engine.kernels is not None and engine.kernels.name()


def test_ledger_records_the_run_and_the_gate_scores_it(tmp_path: Path) -> None:
    model = torch.nn.Linear(8, 2)
    ledger_path = tmp_path / "run.ledger"
    engine, _, loader, _ = ds.initialize(
        model=model, config=CONFIG, training_data=_data(), ledger_path=str(ledger_path)
    )
    _train(engine, loader)
    engine.save_checkpoint(str(tmp_path / "ckpt"))
    assessment = engine.gate.report()
    assert 0.0 <= assessment.score <= 100.0
    assert engine.ledger.verify_ledger_integrity().ok
    engine.ledger.close()
    kinds = [json.loads(line)["kind"] for line in ledger_path.read_text().splitlines()]
    assert kinds[0] == "run_start"
    assert kinds.count("train_step") == 2  # steps 2 and 4 (steps_per_print=2)
    assert "readiness_assessment" in kinds


def test_initialize_without_model_or_config_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="model="):
        ds.initialize(config=CONFIG)
    with pytest.raises(ConfigError, match="config="):
        ds.initialize(model=torch.nn.Linear(2, 2))
