"""Layer specs (DeepSpeed's partition_config) and transformers' tp_plan as specs."""

from __future__ import annotations

import re
from typing import ClassVar

import pytest
from torch import nn

from ds.interfaces.errors import ConfigError
from ds.parallel.tp import plan_for
from ds.parallel.tp.hf_plan import hf_tp_plan, specs_from_hf_plan
from ds.parallel.tp.specs import AutoTPConfig, PartitionType, TPLayerSpec, preset


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj = nn.Linear(8, 8)
        self.o_proj = nn.Linear(8, 8)
        self.gate_up_proj = nn.Linear(8, 16)
        self.gate = nn.Linear(8, 4)


def test_dict_specs_place_modules_by_parameter_name() -> None:
    cfg = {
        "layer_specs": [
            {"patterns": [r".*\.q_proj\.weight$"], "partition_type": "column"},
            {"patterns": [r".*\.o_proj\.weight$"], "partition_type": "row"},
            {"patterns": [r".*gate_up_proj\.weight$"], "shape": [2, -1], "partition_dim": 0},
            {"patterns": [r".*\.gate\.weight$"], "partition_type": "skip"},
        ]
    }
    model = nn.Sequential(_Block())
    plan = plan_for(model, cfg)
    assert plan["0.q_proj"].style == "colwise" and plan["0.o_proj"].style == "rowwise"
    assert (plan["0.gate_up_proj"].style, plan["0.gate_up_proj"].fused) == ("colwise", 2)
    assert plan["0.gate"].style == "replicate"
    assert plan_for(model, AutoTPConfig.from_dict(cfg)) == plan


def test_spec_checks_shape_and_model_type() -> None:
    with pytest.raises(ValueError, match="partition_dim"):
        TPLayerSpec(patterns=["x"], shape=((2, 2), -1), partition_dim=1)
    spec = TPLayerSpec(patterns=[r".*q\.weight$"], partition_type="row", model_types=["llama"])
    assert spec.partition_type is PartitionType.ROW and spec.get_partition_dim() == 1
    assert spec.matches("a.q.weight", "LLaMA") and not spec.matches("a.q.weight", "gpt2")
    unequal = AutoTPConfig(layer_specs=[TPLayerSpec([".*q_proj"], shape=((8, 4, 4), -1))])
    with pytest.raises(ConfigError, match="unequal"):
        plan_for(nn.Sequential(_Block()), unequal)
    assert len(preset("llama").layer_specs) == 4 and preset("nope") is None


def test_hf_plan_merges_config_class_and_instance_entries() -> None:
    class Config:
        base_model_tp_plan: ClassVar[dict[str, str]] = {"layers.*.q_proj": "colwise"}

    class Model:
        _tp_plan: ClassVar[dict[str, str]] = {"lm_head": "colwise_gather_output"}

        def __init__(self) -> None:
            self.config = Config()
            self._tp_plan = {"model.layers.*.q_proj": "colwise", "extra": "rowwise"}

    assert hf_tp_plan(Model()) == {
        "layers.*.q_proj": "colwise",
        "lm_head": "colwise_gather_output",
        "extra": "rowwise",
    }
    assert hf_tp_plan(nn.Linear(2, 2)) is None


def test_hf_plan_as_specs() -> None:
    specs = specs_from_hf_plan(
        {"layers.*.q_proj": "colwise", "lm_head": "colwise_rep", "norm": "embedding_rowwise"}
    )
    assert specs is not None
    q, head, norm = specs
    assert re.match(q.patterns[0], "model.layers.3.q_proj.weight")
    assert head.gather_output and norm.partition_type is PartitionType.SKIP
    assert specs_from_hf_plan({}) is None
    with pytest.raises(ValueError, match="local_colwise"):
        specs_from_hf_plan({"a": "local_colwise", "b": "rowwise"})


def test_specs_limited_to_a_model_type_apply_to_that_model_only() -> None:
    from types import SimpleNamespace

    cfg = {
        "layer_specs": [
            {
                "patterns": [r".*\.q_proj\.weight$"],
                "partition_type": "row",
                "model_types": ["llama"],
            },
            {"patterns": [r".*\.q_proj\.weight$"], "partition_type": "column"},
            {"patterns": [r".*\.weight$"], "partition_type": "skip"},
        ]
    }
    model = nn.Sequential(_Block())
    assert plan_for(model, cfg)["0.q_proj"].style == "colwise"
    model.config = SimpleNamespace(model_type="llama")
    assert plan_for(model, cfg)["0.q_proj"].style == "rowwise"


def test_a_bad_layer_spec_is_one_config_error() -> None:
    bad = {"layer_specs": [{"patterns": ["x"], "partition_type": "diagonal"}]}
    with pytest.raises(ConfigError, match=r"partition_config.*'diagonal'"):
        plan_for(nn.Sequential(_Block()), bad)
