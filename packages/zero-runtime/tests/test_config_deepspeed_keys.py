"""Keys and readings of DeepSpeed 0.19.8 that configs in the wild rely on (each once failed in ds)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from ds.interfaces.errors import ConfigError
from ds.zero.config import UnimplementedConfigWarning, load_config, resolve

# The shape of public fine-tuning configs DeepSpeed accepts and ds used to refuse.
PUBLIC: dict[str, Any] = {
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 8,
    "bf16": {"enabled": True, "bf16_master_weights_and_grads": False},
    "zero_optimization": {
        "stage": 2,
        "sub_group_size": 0,
        "offload_optimizer": {"device": "cpu"},
        "zenflow": {"topk_ratio": 0.05, "update_interval": 4, "overlap_step": True},
    },
    "comms_config": {"verbose": False},
    "monitor_config": {"enabled": False},
    "fp8": {"enabled": False},
}


def _load(cfg: Any) -> tuple[Any, list[str]]:
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        out = load_config(cfg)
    return out, [str(w.message) for w in record if w.category is UnimplementedConfigWarning]


def test_public_config_loads_with_warnings_naming_what_is_ignored() -> None:
    cfg, messages = _load(PUBLIC)
    assert cfg.zero_optimization.sub_group_size == 0
    assert cfg.zero_optimization.zenflow is not None
    assert cfg.zero_optimization.zenflow.update_interval == 4
    text = " ".join(messages)
    for key in ("comms_config", "monitor_config", "fp8", "zero_optimization.zenflow"):
        assert key in text
    assert "did you mean 'comms_logger'" in text
    resolve(cfg, 2)


def test_unknown_keys_inside_strict_sections_stay_errors() -> None:
    with pytest.raises(ConfigError, match=r"bf16\.master_weights: unknown key in bf16"):
        load_config({"train_batch_size": 8, "bf16": {"enabled": True, "master_weights": True}})


def test_unknown_keys_where_deepspeed_reads_key_by_key_warn() -> None:
    cfg, messages = _load(
        {"train_batch_size": 8, "aio": {"queue_dept": 4}, "optimizer": {"type": "AdamW", "x": 1}}
    )
    assert "aio.queue_dept" in messages[0] and "did you mean 'queue_depth'" in messages[0]
    assert "optimizer.x" in messages[0]
    assert cfg.aio.queue_depth == 8


def test_section_without_type_is_ignored_like_deepspeed() -> None:
    cfg, messages = _load({"train_batch_size": 8, "optimizer": {"params": {"lr": 1.0}}})
    assert cfg.optimizer is None
    assert "no 'type'" in messages[0]


@pytest.mark.parametrize(
    ("key", "where"),
    [("nebula", {}), ("elasticity", {}), ("amp", {}), ("sparse_gradients", None)],
)
def test_removed_deepspeed_features_are_refused(key: str, where: Any) -> None:
    value = where if where is not None else False
    with pytest.raises(ConfigError, match=rf"{key}: no longer supported"):
        load_config({"train_batch_size": 8, key: value})


def test_removed_zero_keys_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"zero_optimization\.mics_shard_size: no longer"):
        load_config(
            {"train_batch_size": 8, "zero_optimization": {"stage": 3, "mics_shard_size": 2}}
        )


def test_auto_in_a_strict_section_is_the_default() -> None:
    cfg, _ = _load(
        {
            "train_batch_size": 8,
            "zero_optimization": {"stage": 2, "overlap_comm": "auto", "unknown_one": "auto"},
            "fp16": {"loss_scale": "auto"},
        }
    )
    assert cfg.zero_optimization.overlap is False and cfg.fp16.loss_scale == 0.0


def test_auto_bucket_without_hidden_size_is_deepspeeds_default() -> None:
    cfg = load_config({"train_batch_size": 8, "zero_optimization": {"reduce_bucket_size": "auto"}})
    assert resolve(cfg, 2).reduce_bucket_size == 500_000_000
    assert resolve(cfg, 2, hidden_size=64).reduce_bucket_size == 64 * 64


def test_param_offload_below_stage_3_warns_and_is_off() -> None:
    cfg, messages = _load(
        {
            "train_batch_size": 8,
            "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}},
        }
    )
    assert cfg.zero_optimization.offload_param_device == "none"
    assert any("has no effect at ZeRO stage 2" in m for m in messages)


def test_unknown_warmup_type_falls_back_to_log_with_a_warning() -> None:
    cfg, messages = _load(
        {"train_batch_size": 8, "scheduler": {"type": "WarmupLR", "params": {"warmup_type": "x"}}}
    )
    assert cfg.scheduler is not None and cfg.scheduler.params["warmup_type"] == "log"
    assert any("logarithmic" in m for m in messages)


@pytest.mark.parametrize(
    ("zero", "needle"),
    [
        ({"stage": 2, "cpu_offload": True, "offload_optimizer": {"device": "cpu"}}, "cpu_offload"),
        (
            {"stage": 3, "stage3_prefetch_bucket_size": 5, "prefetch_bucket_size": 7},
            "are one key",
        ),
        ({"stage": 3, "compute_grad_norm": False}, "compute_grad_norm=false"),
        ({"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}, "needs ZeRO stage 3"),
        ({"stage": 2, "zenflow": {"topk_ratio": 1.5}}, "zero_optimization.zenflow.topk_ratio"),
    ],
)
def test_deepspeed_zero_checks(zero: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        load_config({"train_batch_size": 8, "zero_optimization": zero})


def test_precision_and_reduction_checks() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(
            {
                "train_batch_size": 8,
                "bf16": {"enabled": True, "bf16_optimizer_states": True},
                "gradient_allreduce_op": "sum",
                "zero_optimization": {"stage": 3},
            }
        )
    text = str(info.value)
    assert "bf16.bf16_optimizer_states needs bf16.bf16_master_weights_and_grads" in text
    assert "gradient_allreduce_op='sum' is not supported with ZeRO stage 3" in text
    assert load_config({"gradient_allreduce_op": "SUM"}).gradient_allreduce_op == "sum"
    with pytest.raises(ConfigError, match="Invalid gradient_allreduce_op 'max'"):
        load_config({"train_batch_size": 8, "gradient_allreduce_op": "max"})
    with pytest.raises(ConfigError, match="loss_scale must be a number, got list"):
        load_config({"fp16": {"enabled": True, "loss_scale": []}})
    assert load_config({"fp16": {"loss_scale": "3"}}).fp16.loss_scale == 3.0
    # DeepSpeed takes fp32, fp16 and bf16 in any case, not the long names.
    with pytest.raises(ConfigError, match="communication_data_type"):
        load_config({"train_batch_size": 8, "communication_data_type": "float32"})
    assert load_config({"communication_data_type": "BF16"}).communication_data_type == "bf16"


def test_old_boolean_zero_form_is_stage_1() -> None:
    cfg = load_config({"train_batch_size": 8, "zero_optimization": True, "allgather_size": 1000})
    assert cfg.zero_optimization.stage == 1
    assert cfg.zero_optimization.allgather_bucket_size == 1000


def test_deepspeed_checkpoint_writer_block_is_accepted_and_checked() -> None:
    cfg, messages = _load(
        {"train_batch_size": 8, "checkpoint": {"writer": {"type": "fast", "decoupled": True}}}
    )
    assert cfg.checkpoint.writer == "python"  # ds's own writer name, untouched
    assert any("DeepSpeed's writer block" in m for m in messages)
    with pytest.raises(ConfigError, match=r"checkpoint\.writer\.type"):
        load_config({"train_batch_size": 8, "checkpoint": {"writer": {"type": "SLOW"}}})


def test_steps_per_print_infinity_means_never(tmp_path: Any) -> None:
    # accelerate passes float("inf"); DeepSpeed 0.19.8 takes it (its reading is unvalidated).
    cfg = {"train_batch_size": 2, "steps_per_print": float("inf")}
    assert load_config(cfg).steps_per_print is None
    path = tmp_path / "ds_config.json"
    path.write_text('{"train_batch_size": 2, "steps_per_print": Infinity}')  # json.dump's spelling
    assert resolve(load_config(str(path)), 1).raw.steps_per_print is None
    with pytest.raises(ConfigError, match="steps_per_print"):
        load_config({"train_batch_size": 2, "steps_per_print": 0})  # a finite count stays >= 1


def test_resolved_config_reads_like_deepspeeds_config_dict() -> None:
    # transformers' save_model reads engine.config.get("zero_optimization", {}).get("stage").
    cfg = load_config({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3}})
    resolved = resolve(cfg, 2)
    assert resolved.get("zero_optimization", {}).get("stage") == 3
    assert resolved.get("train_batch_size") == 4 and resolved.get("gradient_clipping") == 1.0
    assert resolved.get("no_such_section", {}) == {}
