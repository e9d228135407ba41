"""Filling "auto" values of a DeepSpeed-style config from TrainingArguments."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import TrainingArguments

from ds.integrations.hf.config import fill_auto
from ds.interfaces.errors import ConfigError


def targs(tmp_path: Path, **kw: object) -> TrainingArguments:
    base: dict[str, object] = dict(
        output_dir=str(tmp_path),
        per_device_train_batch_size=3,
        gradient_accumulation_steps=2,
        learning_rate=5e-4,
        adam_beta1=0.8,
        adam_beta2=0.95,
        adam_epsilon=1e-7,
        weight_decay=0.1,
        max_grad_norm=0.5,
        use_cpu=True,
        report_to=[],
    )
    base.update(kw)
    return TrainingArguments(**base)  # type: ignore[arg-type]


def test_autos_filled_from_training_arguments(tmp_path: Path) -> None:
    cfg = {
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
        },
        "bf16": {"enabled": "auto"},
        "zero_optimization": {"stage": 2},
    }
    out = fill_auto(cfg, targs(tmp_path), world_size=4)
    assert out["train_micro_batch_size_per_gpu"] == 3
    assert out["gradient_accumulation_steps"] == 2
    assert out["train_batch_size"] == 24
    assert out["gradient_clipping"] == 0.5
    assert out["optimizer"]["params"] == {
        "lr": 5e-4,
        "betas": [0.8, 0.95],
        "eps": 1e-7,
        "weight_decay": 0.1,
    }
    assert out["bf16"] == {"enabled": False}
    assert cfg["train_batch_size"] == "auto"  # the caller's dict is not mutated


def test_path_source_and_missing_keys_default_from_args(tmp_path: Path) -> None:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 3}, "gradient_clipping": 2.0}))
    out = fill_auto(str(path), targs(tmp_path), world_size=2)
    assert out["train_batch_size"] == 12
    assert out["gradient_clipping"] == 2.0  # an explicit number is kept


def test_conflicting_batch_size_names_both(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"train_micro_batch_size_per_gpu=8.*per_device_train"):
        fill_auto({"train_micro_batch_size_per_gpu": 8}, targs(tmp_path), world_size=1)


def test_fixed_scheduler_section_is_rejected_auto_one_dropped(tmp_path: Path) -> None:
    fixed = {"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}}
    with pytest.raises(ConfigError, match="lr_scheduler_type"):
        fill_auto(fixed, targs(tmp_path), world_size=1)
    auto = {"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": "auto"}}}
    assert "scheduler" not in fill_auto(auto, targs(tmp_path), world_size=1)


def test_not_json_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="neither an existing file nor a JSON object"):
        fill_auto("no-such-file.json", targs(tmp_path), world_size=1)
