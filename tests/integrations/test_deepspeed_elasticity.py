"""``deepspeed.elasticity.compute_elastic_config`` on DeepSpeed's documented examples (its
docstring's config and the cases of its own unit tests), and its refusals."""

from __future__ import annotations

import copy

import pytest

from ds.full.compat.deepspeed import elasticity
from ds.full.compat.deepspeed.elasticity.config import (
    ElasticityConfigError,
    ElasticityError,
    ElasticityIncompatibleWorldSize,
)

BASE = {
    "elasticity": {
        "enabled": True, "max_train_batch_size": 10000, "micro_batch_sizes": [8, 12, 16, 17],
        "min_gpus": 32, "max_gpus": 1500, "min_time": 20, "version": 0.1,
    }
}  # fmt: skip


def _cfg(**changes: object) -> dict:
    cfg = copy.deepcopy(BASE)
    cfg["elasticity"].update(changes)
    return cfg


def test_10k_batch_over_32_to_1500_gpus() -> None:
    batch, gpus = elasticity.compute_elastic_config(_cfg(), target_deepspeed_version="0.19.8")
    assert batch == 9792 and len(gpus) == 23
    micro = BASE["elasticity"]["micro_batch_sizes"]
    for g in gpus:
        assert 32 <= g <= 1500 and batch % g == 0
        assert any((batch // g) % m == 0 for m in micro)


def test_world_size_picks_the_largest_micro_batch_that_divides() -> None:
    batch, gpus, micro = elasticity.compute_elastic_config(_cfg(), "0.19.8", world_size=64)
    assert (batch, micro) == (9792, 17) and 64 in gpus
    with pytest.raises(ElasticityIncompatibleWorldSize, match="world size 128"):
        elasticity.compute_elastic_config(_cfg(), "0.19.8", world_size=128)
    cfg = _cfg(max_train_batch_size=32, micro_batch_sizes=[1, 2, 3, 7], min_gpus=1)
    batch, _, micro = elasticity.compute_elastic_config(cfg, "0.19.8", world_size=4)
    assert batch <= 32 and micro == 3


def test_batch_stays_within_the_maximum() -> None:
    cfg = _cfg(max_train_batch_size=100, micro_batch_sizes=[8, 10, 12], min_gpus=1)
    batch, gpus = elasticity.compute_elastic_config(cfg, "0.19.8")
    assert batch == 96 and gpus == [1, 2, 3, 4, 6, 8, 12]


def test_version_02_works_in_whole_nodes_with_model_parallelism(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg = _cfg(model_parallel_size=4, num_gpus_per_node=8, version=0.2)
    monkeypatch.setenv("WORLD_SIZE", "16")
    batch, dp_sizes = elasticity.compute_elastic_config(cfg, "0.19.8")
    assert all(d % 2 == 0 for d in dp_sizes)  # 2 data-parallel ranks per node of 8 GPUs / mp 4
    assert batch <= 10000 and batch % 2 == 0
    bad = _cfg(model_parallel_size=16, num_gpus_per_node=8, version=0.2)
    with pytest.raises(ElasticityError, match="divisible by model_parallel_size"):
        elasticity.compute_elastic_config(bad, "0.19.8", world_size=16)
    monkeypatch.delenv("WORLD_SIZE")
    with pytest.raises(ElasticityConfigError, match="WORLD_SIZE"):
        elasticity.compute_elastic_config(cfg, "0.19.8")


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"enabled": False}, "enabled is false"),
        ({"version": "0.3"}, "version 0.3"),
        ({"micro_batch_sizes": [1, 4, -1]}, "positive integers"),
        ({"micro_batch_sizes": 5}, "list of positive integers"),
        ({"micro_batch_sizes": [2, 0.5, 4]}, "positive integers"),
        ({"min_gpus": -1}, "min_gpus"),
        ({"min_gpus": 64, "max_gpus": 32}, "above max_gpus"),
        ({"model_parallel_size": 4, "num_gpus_per_node": 8}, "use version 0.2"),
    ],
)
def test_bad_sections_are_refused_naming_the_key(change: dict, match: str) -> None:
    with pytest.raises(ElasticityError, match=match):
        elasticity.compute_elastic_config(_cfg(**change), "0.19.8")


def test_missing_keys_old_versions_and_no_valid_gpu_count() -> None:
    for key in ("max_train_batch_size", "micro_batch_sizes"):
        cfg = _cfg()
        del cfg["elasticity"][key]
        with pytest.raises(ElasticityConfigError, match=key):
            elasticity.compute_elastic_config(cfg, "0.19.8")
    with pytest.raises(ElasticityError, match="predates elasticity"):
        elasticity.compute_elastic_config(_cfg(), target_deepspeed_version="0.2")
    with pytest.raises(ElasticityConfigError, match="no 'elasticity' section"):
        elasticity.compute_elastic_config({}, "0.19.8")
    cfg = _cfg(max_train_batch_size=50, micro_batch_sizes=[31], min_gpus=8)
    with pytest.raises(ElasticityError, match="no GPU count"):
        elasticity.compute_elastic_config(cfg, "0.19.8")


def test_runtime_config_must_match_the_schedulers(monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    monkeypatch.setenv("DEEPSPEED_ELASTICITY_CONFIG", json.dumps(BASE["elasticity"]))
    elasticity.ensure_immutable_elastic_config(BASE["elasticity"])
    changed = dict(BASE["elasticity"], max_train_batch_size=2000)
    with pytest.raises(ElasticityConfigError, match="max_train_batch_size"):
        elasticity.ensure_immutable_elastic_config(changed)
    assert elasticity.elasticity_enabled(BASE) and not elasticity.elasticity_enabled({})
