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
