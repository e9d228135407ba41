"""Bad configs each give one clear ConfigError naming the key, the value and the fix."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ds.interfaces.errors import ConfigError
from ds.zero.config import load_config, resolve

OK_OPT = {"type": "AdamW", "params": {"lr": 1e-3}}


def _cfg(**kw: Any) -> dict[str, Any]:
    return {"train_batch_size": 8, "optimizer": OK_OPT, **kw}


BAD: list[tuple[str, Any, list[str]]] = [
    (
        "unknown zero key",
        _cfg(zero_optimization={"stage": 3, "stage3_prefetch_bucket": 1}),
        ["zero_optimization.stage3_prefetch_bucket", "did you mean 'stage3_prefetch_bucket_size'"],
    ),
    (
        "unknown fp16 key",
        _cfg(fp16={"enabled": True, "loss_scal": 0}),
        ["fp16.loss_scal", "'loss_scale'"],
    ),
    (
        "unknown offload key",
        _cfg(zero_optimization={"stage": 2, "offload_optimizer": {"devic": "cpu"}}),
        ["zero_optimization.offload_optimizer.devic", "'device'"],
    ),
    ("wrong type for batch size", {"train_batch_size": "eight"}, ["train_batch_size", "'eight'"]),
    ("negative batch size", {"train_batch_size": -4}, ["train_batch_size", "-4"]),
    (
        "zero stage out of range",
        _cfg(zero_optimization={"stage": 5}),
        ["zero_optimization.stage", "5"],
    ),
    (
        "non-integral float for int",
        _cfg(zero_optimization={"reduce_bucket_size": 550.5}),
        ["reduce_bucket_size", "550.5"],
    ),
    (
        "bucket size not a number",
        _cfg(zero_optimization={"reduce_bucket_size": "big"}),
        ["reduce_bucket_size", "'big'"],
    ),
    (
        "bucket size zero",
        _cfg(zero_optimization={"reduce_bucket_size": 0}),
        ["zero_optimization", "reduce_bucket_size must be > 0, got 0"],
    ),
    (
        "fp16 and bf16 both on",
        _cfg(fp16={"enabled": True}, bf16={"enabled": True}),
        ["enable at most one"],
    ),
    (
        "bf16 and bfloat16 both given",
        _cfg(bf16={"enabled": True}, bfloat16={"enabled": True}),
        ["'bfloat16'"],
    ),
    (
        "offload at stage 0",
        _cfg(zero_optimization={"stage": 0, "offload_optimizer": {"device": "cpu"}}),
        ["offload_optimizer.device='cpu' needs ZeRO stage 1, 2 or 3"],
    ),
    (
        "offload with SGD",
        {
            "train_batch_size": 8,
            "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
            "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
        },
        ["ds-ops-kernels", "'sgd'"],
    ),
    (
        "nvme optimizer offload at stage 2",
        _cfg(
            zero_optimization={
                "stage": 2,
                "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"},
            }
        ),
        ["'nvme' needs ZeRO stage 3"],
    ),
    (
        "bad offload device",
        _cfg(zero_optimization={"stage": 2, "offload_optimizer": {"device": "gpu"}}),
        ["offload_optimizer.device", "'gpu'"],
    ),
    (
        "unknown optimizer",
        {"train_batch_size": 8, "optimizer": {"type": "Adamm"}},
        ["optimizer.type", "'Adamm'"],
    ),
    (
        "DeepSpeed-only optimizer",
        {"train_batch_size": 8, "optimizer": {"type": "OneBitAdam"}},
        ["'OneBitAdam' is a DeepSpeed optimizer ds does not provide"],
    ),
    (
        "unknown optimizer param",
        {"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"lrr": 1}}},
        ["'lrr'", "did you mean 'lr'"],
    ),
    (
        "betas of wrong length",
        {"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"betas": [0.9]}}},
        ["betas must be two numbers"],
    ),
    (
        "negative lr",
        {"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"lr": -1}}},
        ["lr must be a finite, non-negative number"],
    ),
    (
        # JSON readers accept NaN and Infinity; "lr < 0" alone would let NaN through.
        "NaN lr",
        {"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"lr": float("nan")}}},
        ["lr must be a finite, non-negative number, got nan"],
    ),
    (
        "infinite lr",
        {"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"lr": float("inf")}}},
        ["lr must be a finite, non-negative number, got inf"],
    ),
    (
        # A NaN max norm would make every gradient NaN; "< 0" alone would let it through.
        "NaN gradient_clipping",
        _cfg(gradient_clipping=float("nan")),
        ["gradient_clipping must be finite and >= 0 (0 disables), got nan"],
    ),
    (
        "infinite fp16 loss_scale",
        _cfg(fp16={"enabled": True, "loss_scale": float("inf")}),
        ["fp16.loss_scale", "finite"],
    ),
    (
        "NaN gradient_predivide_factor",
        _cfg(gradient_predivide_factor=float("nan")),
        ["gradient_predivide_factor", "finite number"],
    ),
    (
        "NaN beta",
        {
            "train_batch_size": 8,
            "optimizer": {"type": "Adam", "params": {"betas": [0.9, float("nan")]}},
        },
        ["betas must be two numbers in [0, 1)"],
    ),
    (
        "unknown scheduler",
        _cfg(scheduler={"type": "WarmupLRR"}),
        ["'WarmupLRR'", "did you mean 'WarmupLR'"],
    ),
    (
        "unknown scheduler param",
        _cfg(scheduler={"type": "WarmupLR", "params": {"warmup_max_l": 1}}),
        ["'warmup_max_l'", "did you mean 'warmup_max_lr'"],
    ),
    (
        "scheduler missing required param",
        _cfg(scheduler={"type": "WarmupDecayLR", "params": {}}),
        ["needs params total_num_steps"],
    ),
    (
        "negative clipping",
        _cfg(gradient_clipping=-1.0),
        ["gradient_clipping must be finite and >= 0"],
    ),
    ("steps_per_print zero", _cfg(steps_per_print=0), ["steps_per_print"]),
    ("negative loss scale", _cfg(fp16={"enabled": True, "loss_scale": -2}), ["fp16.loss_scale"]),
    ("hysteresis zero", _cfg(fp16={"enabled": True, "hysteresis": 0}), ["fp16.hysteresis"]),
    ("wrong section type", _cfg(zero_optimization=2), ["zero_optimization"]),
    ("malformed JSON string", '{"train_batch_size": 8,', ["JSON string is malformed"]),
    ("missing file", "/nonexistent/ds_config.json", ["does not exist"]),
    ("not an object", "[1, 2]", ["must be a JSON object"]),
]


@pytest.mark.parametrize(("why", "config", "needles"), BAD, ids=[b[0] for b in BAD])
def test_bad_config_is_one_clear_error(why: str, config: Any, needles: list[str]) -> None:
    if isinstance(config, str) and config.startswith("["):
        with pytest.raises(ConfigError) as info:
            load_config(config if not config.startswith("[") else _write_list(config))
    else:
        with pytest.raises(ConfigError) as info:
            load_config(config)
    message = str(info.value)
    for needle in needles:
        assert needle in message, f"{why}: {needle!r} not in {message!r}"


def _write_list(text: str) -> str:
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        f.write(text)
    return f.name


BAD_FOR_WORLD: list[tuple[str, dict[str, Any], list[str]]] = [
    (
        "inconsistent batch triad",
        {
            "train_batch_size": 32,
            "train_micro_batch_size_per_gpu": 4,
            "gradient_accumulation_steps": 2,
        },
        ["train_batch_size=32", "(4)", "(2)", "world size (2) = 16"],
    ),
    (
        "train not divisible by micro x world",
        {"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4},
        ["train_batch_size=10", "= 8"],
    ),
    (
        "train not divisible by gas x world",
        {"train_batch_size": 10, "gradient_accumulation_steps": 4},
        ["train_batch_size=10", "= 8"],
    ),
    (
        "no batch size at all",
        {"gradient_accumulation_steps": 2},
        ["set train_batch_size or train_micro_batch_size_per_gpu"],
    ),
    (
        "train not divisible by world",
        {"train_batch_size": 3},
        ["not divisible by the world size (2)"],
    ),
    (
        "clipping left auto",
        {"train_batch_size": 8, "gradient_clipping": "auto"},
        ["gradient_clipping: 'auto'"],
    ),
    (
        "optimizer lr left auto",
        {"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}},
        ["optimizer.params.lr: 'auto' but nothing filled it"],
    ),
    (
        # DeepSpeed fails on an unfilled "auto" in the batch triad (only the Trainer fills it).
        "batch size left auto",
        {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 4},
        ["train_batch_size: 'auto' is filled by a framework integration"],
    ),
    (
        "scheduler param left auto",
        {
            "train_batch_size": 8,
            "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": "auto"}},
        },
        ["scheduler.params.warmup_num_steps: 'auto' but nothing filled it"],
    ),
    (
        # A misspelt key is ignored (as DeepSpeed ignores it); the report names it.
        "misspelt batch size",
        {"train_batch_sze": 8},
        ["set train_batch_size", "train_batch_sze", "did you mean 'train_batch_size'"],
    ),
]


@pytest.mark.parametrize(
    ("why", "config", "needles"), BAD_FOR_WORLD, ids=[b[0] for b in BAD_FOR_WORLD]
)
def test_bad_config_for_a_world_size(why: str, config: dict[str, Any], needles: list[str]) -> None:
    cfg = load_config(config)
    with pytest.raises(ConfigError) as info:
        resolve(cfg, 2)
    for needle in needles:
        assert needle in str(info.value), f"{why}: {needle!r} not in {info.value}"


def test_every_problem_is_listed_in_one_report() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(
            {
                "train_batch_sze": 8,
                "nebula": {"enabled": False},
                "fp16": {"loss_scal": 1},
                "zero_optimization": {"stage": 9, "sub_group_size": -1},
            }
        )
    message = str(info.value)
    assert message.startswith("invalid ds config: 4 problems"), message
    for key in (
        "nebula",
        "fp16.loss_scal",
        "zero_optimization.stage",
        "zero_optimization.sub_group_size",
        "(got -1)",
        "train_batch_sze (unknown key in the top level (did you mean 'train_batch_size'?))",
    ):
        assert key in message


def test_json_string_and_path_and_dict_agree(tmp_path: Any) -> None:
    data = {"train_batch_size": 16, "zero_optimization": {"stage": 2, "reduce_bucket_size": 5e8}}
    path = tmp_path / "c.json"
    path.write_text(json.dumps(data))
    a, b, c = load_config(data), load_config(json.dumps(data)), load_config(str(path))
    assert a == b == c
    assert a.zero_optimization.reduce_bucket_size == 500_000_000


def test_a_key_given_twice_is_refused_in_a_file_and_a_string(tmp_path: Any) -> None:
    text = '{"train_batch_size": 8, "zero_optimization": {"stage": 1, "stage": 3}}'
    path = tmp_path / "c.json"
    path.write_text(text)
    for source in (text, str(path)):
        with pytest.raises(ConfigError, match="'stage' is given twice"):
            load_config(source)
