"""Filling "auto" values of a DeepSpeed-style config from TrainingArguments."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from tiny_models import llama_shape
from transformers import TrainingArguments

from ds.integrations.hf.config import fill_auto, finalize_auto
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
    path.write_text(json.dumps({"zero_optimization": {"stage": 3}, "gradient_clipping": 0.5}))
    out = fill_auto(str(path), targs(tmp_path), world_size=2)
    assert out["train_batch_size"] == 12
    assert out["gradient_clipping"] == 0.5  # an explicit number that agrees is kept
    # As with transformers + DeepSpeed, an absent key is not invented: no clipping section here.
    assert "gradient_clipping" not in fill_auto({}, targs(tmp_path), world_size=1)


def test_conflicting_batch_size_names_both(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"train_micro_batch_size_per_gpu=8.*per_device_train"):
        fill_auto({"train_micro_batch_size_per_gpu": 8}, targs(tmp_path), world_size=1)


def test_bf16_config_with_bf16_false_arguments_is_a_mismatch(tmp_path: Path) -> None:
    # transformers + DeepSpeed stops here; ds once trained in bf16 without a word.
    with pytest.raises(ConfigError, match=r"bf16\.enabled=True but TrainingArguments give bf16"):
        fill_auto({"bf16": {"enabled": True}}, targs(tmp_path, bf16=False), world_size=1)
    with pytest.raises(ConfigError, match=r"fp16\.enabled=False.*fp16\|fp16_full_eval=True"):
        fill_auto({"fp16": {"enabled": False}}, targs(tmp_path, fp16=True), world_size=1)


def test_every_mismatch_is_listed_once(tmp_path: Path) -> None:
    cfg = {
        "train_batch_size": 7,
        "gradient_clipping": 1.0,
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-7, "weight_decay": 0.0},
        },
        "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 0.1}},
    }
    with pytest.raises(ConfigError) as info:
        fill_auto(cfg, targs(tmp_path), world_size=1)
    text = str(info.value)
    assert "in 6 places" in text, text
    for needle in (
        "train_batch_size=7",
        "gradient_clipping=1.0 but TrainingArguments give max_grad_norm=0.5",
        "optimizer.params.lr=0.001 but TrainingArguments give learning_rate=0.0005",
        "optimizer.params.betas=[0.9, 0.999]",
        "optimizer.params.weight_decay=0.0",
        "scheduler.params.warmup_max_lr=0.1",
    ):
        assert needle in text
    assert "optimizer.params.eps" not in text  # 1e-7 agrees with adam_epsilon


def test_scheduler_section_is_kept_and_filled_in_both_phases(tmp_path: Path) -> None:
    auto = {
        "scheduler": {
            "type": "WarmupDecayLR",
            "params": {
                "warmup_min_lr": "auto",
                "warmup_max_lr": "auto",
                "warmup_num_steps": "auto",
                "total_num_steps": "auto",
            },
        }
    }
    args = targs(tmp_path, warmup_steps=0)
    out = finalize_auto(fill_auto(auto, args, world_size=1), args, None, num_training_steps=40)
    assert out["scheduler"]["params"] == {
        "warmup_min_lr": 0,
        "warmup_max_lr": 5e-4,
        "warmup_num_steps": 1,  # never 0: DeepSpeed 0.19.8 refuses it
        "total_num_steps": 40,
    }
    fixed = {"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 10}}}
    with pytest.raises(ConfigError, match=r"total_num_steps=10.*num_training_steps=40"):
        finalize_auto(fill_auto(fixed, args, world_size=1), args, None, num_training_steps=40)


def test_hidden_size_autos_from_the_model_config(tmp_path: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = llama_shape(16, 32, layers=1, heads=2, kv_heads=2, vocab=64)
    model = LlamaForCausalLM(LlamaConfig(**shape))
    zero = {
        "stage": 3,
        "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto",
    }
    out = finalize_auto({"zero_optimization": dict(zero)}, targs(tmp_path), model, 10)
    assert out["zero_optimization"] == {
        "stage": 3,
        "reduce_bucket_size": 256,
        "stage3_prefetch_bucket_size": 230,
        "stage3_param_persistence_threshold": 160,
    }
    with pytest.raises(ConfigError, match="no hidden_size"):
        finalize_auto({"zero_optimization": dict(zero)}, targs(tmp_path), torch.nn.Linear(2, 2), 10)


def test_not_json_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="neither an existing file nor a JSON object"):
        fill_auto("no-such-file.json", targs(tmp_path), world_size=1)


# -- differential: transformers' HfTrainerDeepSpeedConfig on the same configs and arguments ------

FILL_FIXTURE = Path(__file__).parent / "fixtures" / "hf_fill_verdicts.json"
FILL_CASES = json.loads(FILL_FIXTURE.read_text())["cases"]


class _Args:
    """The TrainingArguments attributes both fillers read (the recorded ones)."""

    def __init__(self, **kw: object) -> None:
        self.__dict__.update(kw)

    def get_warmup_steps(self, num_training_steps: int) -> int:
        return int(self.warmup_steps)  # type: ignore[attr-defined]


class _Model:
    def __init__(self, hidden: int) -> None:
        self.config = type("C", (), {"hidden_size": hidden})()


def _mismatched_keys(message: str) -> set[str]:
    return set(re.findall(r"^  - ([\w.]+)=", message, flags=re.M))


def test_fills_and_refuses_as_transformers_does() -> None:
    assert len(FILL_CASES) >= 100
    for case in FILL_CASES:
        args = _Args(**case["args"])
        phase = 1
        try:
            cfg = fill_auto(case["config"], args, case["world_size"])
            phase = 2
            cfg = finalize_auto(cfg, args, _Model(case["hidden_size"]), case["num_training_steps"])
        except ConfigError as exc:
            assert case["transformers"] == "mismatch", (case["changes"], str(exc))
            got = _mismatched_keys(str(exc))
            want = set(case["keys"])
            if phase == 1:  # ds stops after the first pass; transformers lists both
                want -= {"scheduler.params.total_num_steps", "scheduler.params.warmup_num_steps"}
            assert got == want, (case["changes"], str(exc), case["keys"])
            continue
        assert case["transformers"] == "filled", (case["changes"], case["keys"])
        assert _json(cfg) == case["filled"], (case["changes"], cfg, case["filled"])


def _json(cfg: object) -> object:
    return json.loads(json.dumps(cfg))
