"""DeepSpeed's documented example configs load; documented-but-unimplemented keys warn once."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

from ds.zero.config import UnimplementedConfigWarning, load_config, resolve

# Written from the key names of DeepSpeed's config documentation and tutorials (fixture shared
# with tools/deepspeed_verdicts.py).
_EXAMPLES = json.loads((Path(__file__).parent / "fixtures" / "documented_configs.json").read_text())
# The examples that load at world size 2 with nothing unimplemented in them.
DOCUMENTED: dict[str, dict[str, Any]] = {
    name: _EXAMPLES[name]
    for name in (
        "getting-started-docs",
        "fp16-dynamic-scaling",
        "zero2-offload",
        "zero3-offload-nvme",
        "zero3-unprefixed-and-deprecated-keys",
        "deprecated-cpu-offload",
        "one-cycle",
        "lr-range-test",
        "warmup-decay-cosine",
        "activation-checkpointing-and-monitors-docs",
    )
}


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_documented_example_loads(name: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnimplementedConfigWarning)
        cfg = load_config(DOCUMENTED[name])
    resolved = resolve(cfg, 2)
    assert resolved.train_batch_size == (
        resolved.train_micro_batch_size_per_gpu * resolved.gradient_accumulation_steps * 2
    )


def test_aliases_land_on_one_field() -> None:
    a = load_config(DOCUMENTED["zero3-unprefixed-and-deprecated-keys"]).zero_optimization
    assert a.prefetch_bucket_size == 50_000_000
    assert a.param_persistence_threshold == 10_000
    assert a.gather_16bit_weights_on_model_save is True
    assert a.max_live_parameters == 1_000_000_000  # default when neither spelling is given
    b = load_config(DOCUMENTED["zero3-offload-nvme"])
    assert b.aio.intra_op_parallelism == 1 and b.zero_optimization.max_reuse_distance == 10**9
    c = load_config(DOCUMENTED["deprecated-cpu-offload"]).zero_optimization
    assert c.offload_optimizer_device == "cpu"


def test_unimplemented_keys_give_one_warning_naming_them() -> None:
    cfg = {
        "train_batch_size": 8,
        "autotuning": {"enabled": True},
        "dump_state": True,
        "hybrid_engine": {"enabled": True, "max_out_tokens": 64},
        "wandb": {"enabled": False},
        "zero_optimization": {"stage": 2, "round_robin_gradients": True},
        "prescale_gradients": True,
        "fp16": {"enabled": True, "auto_cast": True},
    }
    with pytest.warns(UnimplementedConfigWarning) as record:
        load_config(cfg)
    assert len(record) == 1
    text = str(record[0].message)
    for key in (
        "autotuning",
        "dump_state",
        "hybrid_engine",
        "zero_optimization.round_robin_gradients",
    ):
        assert key in text
    assert "wandb" not in text  # disabled sections are not reported


_TRAINER_FILLS = {
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 1,
    "train_batch_size": 4,
    "gradient_clipping": 1.0,
}


def test_repository_example_configs_load() -> None:
    root = Path(__file__).resolve().parents[3] / "examples"
    paths = sorted(root.glob("ds_config_*.json"))
    assert paths, "examples/ds_config_*.json are missing"
    for path in paths:
        raw = json.loads(path.read_text())
        # Configs written for the HF Trainer say "auto"; the Trainer fills those from its
        # arguments (tests/inference/test_real_model_finetune.py runs that path), so here they
        # get the numbers a two-rank Trainer with batch 2 and clipping 1.0 would give them.
        filled = {
            key: _TRAINER_FILLS.get(key, value) if value == "auto" else value
            for key, value in raw.items()
        }
        resolve(load_config(filled), 2)
    assert (
        json.loads((root / "ds_config_zero2.json").read_text())["zero_optimization"]["stage"] == 2
    )
