"""``deepspeed.module_inject`` and ``deepspeed.runtime.tensor_parallel``: AutoTP's layer specs and
transformers' tp_plan, as DeepSpeed exposes them (backed by :mod:`ds.parallel.tp`)."""

from __future__ import annotations

import re
from typing import ClassVar

from ds.full.compat.deepspeed.module_inject import AutoTPConfig, AutoTPPresets, PartitionType
from ds.full.compat.deepspeed.module_inject.tp_plan_converter import TPPlanConverter
from ds.full.compat.deepspeed.runtime.tensor_parallel.config import _get_hf_tp_plan


def test_tp_plan_converts_to_layer_specs() -> None:
    class Model:
        _tp_plan: ClassVar[dict[str, str]] = {
            "layers.*.q_proj": "colwise",
            "layers.*.o_proj": "rowwise",
        }

    specs = TPPlanConverter.convert(_get_hf_tp_plan(Model()))
    assert [s.partition_type for s in specs] == [PartitionType.COLUMN, PartitionType.ROW]
    assert re.match(specs[0].patterns[0], "model.layers.0.q_proj.weight")
    assert TPPlanConverter._wildcard_to_regex("a.*.b") == r".*a\..*\.b"
    cfg = AutoTPConfig.from_dict({"layer_specs": [{"patterns": ["x"], "gather_output": True}]})
    assert cfg.layer_specs[0].gather_output and AutoTPPresets.get_preset("qwen2") is not None


def test_autotp_walks_full_paths_and_keeps_tied_weights_whole() -> None:
    from torch import nn

    from ds.full.compat.deepspeed.module_inject.auto_tp import AutoTP
    from ds.full.compat.deepspeed.module_inject.layers import LinearAllreduce, LinearLayer

    model = nn.Module()
    model.layers = nn.ModuleList([nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 4))])
    model.embed = nn.Embedding(10, 4)
    model.lm_head = nn.Linear(4, 10, bias=False)
    model.lm_head.weight = model.embed.weight
    specs = {
        "layer_specs": [
            {"patterns": [r"layers\.\d+\.0\.weight$"], "partition_type": "column"},
            {"patterns": [r"layers\.\d+\.1\.weight$"], "partition_type": "row"},
            {"patterns": [r"lm_head\.weight$"], "gather_output": True},
        ]
    }
    autotp = AutoTP(model, [], "", None, None, None, partition_config=specs)
    autotp.set_tensor_parallel_config(1, None)
    autotp._replace_module(model)
    assert isinstance(model.layers[0][0], LinearLayer)
    assert isinstance(model.layers[0][1], LinearAllreduce)
    assert type(model.lm_head) is nn.Linear and model.lm_head.weight is model.embed.weight


def test_autotp_splits_an_autoep_layers_shared_expert_only() -> None:
    from torch import nn

    from ds.full.compat.deepspeed.module_inject.auto_tp import AutoTP
    from ds.full.compat.deepspeed.module_inject.layers import LinearLayer

    class AutoEPLike(nn.Module):
        _is_autoep_layer = True

        def __init__(self) -> None:
            super().__init__()
            self.shared_experts = nn.Linear(4, 4, bias=False)
            self.experts = nn.Linear(4, 4, bias=False)  # expert parallel: never split here

    model = nn.Module()
    model.moe = AutoEPLike()
    specs = {"layer_specs": [{"patterns": [r".*\.weight$"], "partition_type": "column"}]}
    autotp = AutoTP(model, [], "", None, None, None, partition_config=specs)
    autotp.set_tensor_parallel_config(1, None)
    autotp._replace_module(model)
    assert isinstance(model.moe.shared_experts, LinearLayer)
    assert type(model.moe.experts) is nn.Linear


def test_model_parallel_parameters_are_the_marked_and_the_sliced() -> None:
    import torch

    from ds.full.compat.deepspeed.runtime.utils import is_model_parallel_parameter
    from ds.parallel.tp import TPGroup
    from ds.parallel.tp.layers import sliced_parameter

    plain = torch.nn.Parameter(torch.ones(4, 2))
    marked = torch.nn.Parameter(torch.ones(2))
    marked.tensor_model_parallel = True
    sliced = sliced_parameter(plain, 0, TPGroup(None, None, 2, 1))
    assert [is_model_parallel_parameter(p) for p in (plain, marked, sliced)] == [False, True, True]


def test_tp_training_groups_from_rank_lists(monkeypatch) -> None:
    from ds.full.compat.deepspeed.module_inject import layers
    from ds.full.compat.deepspeed.utils import groups

    made = []
    for name in ("_DATA_PARALLEL_GROUP", "_MODEL_PARALLEL_GROUP", "_TENSOR_MODEL_PARALLEL_GROUP"):
        monkeypatch.setattr(groups, name, None)
    monkeypatch.setattr(groups.dist, "get_world_size", lambda group=None: 6)
    monkeypatch.setattr(groups.dist, "get_rank", lambda group=None: 4)
    monkeypatch.setattr(
        groups.dist, "new_group", lambda ranks: made.append(tuple(ranks)) or tuple(ranks)
    )

    def no_split(*_: object) -> None:
        raise RuntimeError(groups._DEVICE_MESH_SPLIT_UNSUPPORTED)

    monkeypatch.setattr(groups.dist, "initialize_mesh_device", no_split)
    assert groups._init_tp_mesh_device(tensor_model_parallel_size=3) == ((1, 4), (3, 4, 5))
    assert made == [(0, 3), (1, 4), (2, 5), (0, 1, 2), (3, 4, 5)]
    assert groups.get_tensor_model_parallel_group() == (3, 4, 5)
    layers.set_autotp_mode(training=True)
    try:
        assert layers.is_autotp_training_mode()
    finally:
        layers.set_autotp_mode(training=False)
