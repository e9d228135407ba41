"""``deepspeed.autotuning``: the nested-key helpers and the experiment queue's slot bookkeeping;
launching DeepSpeed's experiments is ``ds autotune``'s job and says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ds.full.compat.deepspeed._missing import FeatureNotAvailableError
from ds.full.compat.deepspeed.autotuning import Autotuner
from ds.full.compat.deepspeed.autotuning.scheduler import ResourceManager
from ds.full.compat.deepspeed.autotuning.utils import get_val_by_key, set_val_by_key


def test_nested_keys() -> None:
    exp = {"optimizer": {"type": "Adam"}, "zero_optimization": {"offload": {"device": "cpu"}}}
    assert get_val_by_key(exp, "device") == "cpu" and get_val_by_key(exp, "nope") is None
    set_val_by_key(exp, "device", "nvme")
    assert exp["zero_optimization"]["offload"]["device"] == "nvme"


def test_resource_manager_queues_and_reserves(tmp_path: Path) -> None:
    rm = ResourceManager(None, "worker-0, worker-1", 4, str(tmp_path), None, {" a ": " --b "})
    assert rm.arg_mappings == {"a": "--b"} and [n.host for n in rm.nodes] == [
        "worker-0",
        "worker-1",
    ]
    path = tmp_path / "exp.json"
    path.write_text(json.dumps({"name": "z1", "num_nodes": 2, "num_gpus": 3}))
    rm.schedule_experiments([str(path), str(path)])
    (exp,) = rm.experiment_queue
    assert exp["exp_id"] == 0 and exp["result_dir"] == str(tmp_path / "z1")
    first = rm.resource_request(exp)
    assert first is not None and [r.desc() for r in first] == ["worker-0:0,1,2@", "worker-1:0,1,2@"]
    assert rm.resource_request(exp) is None  # one slot left on each node
    assert rm.status() == "worker-0 (1 idle gpus), worker-1 (1 idle gpus)"
    for r in first:
        r.restore_slots()
    assert rm.status() == "worker-0 (4 idle gpus), worker-1 (4 idle gpus)"
    with pytest.raises(FeatureNotAvailableError, match="ds autotune"):
        rm.run()
    with pytest.raises(FeatureNotAvailableError, match="ds autotune"):
        Autotuner(args=None)
