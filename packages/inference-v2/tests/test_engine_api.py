"""Engine API: put/query/flush/capacity, refusals that change nothing, config validation."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ds.inference import EngineConfig, InferenceEngineV2, build_engine
from ds.interfaces.errors import ConfigError, InferenceError
from ds.interfaces.inference import InferenceEngine


@pytest.fixture
def engine(tiny_dirs: dict[str, Path]) -> InferenceEngineV2:
    return build_engine(
        tiny_dirs["llama"],
        {
            "kv_cache": {"block_size": 16, "num_blocks": 10},
            "state_manager": {
                "max_tracked_sequences": 4,
                "max_context": 200,
                "max_ragged_batch_size": 256,
            },
        },
    )


def test_protocol_and_capacity(engine: InferenceEngineV2) -> None:
    assert isinstance(engine, InferenceEngine)
    cap = engine.capacity()
    assert (cap.free_blocks, cap.total_blocks, cap.block_size) == (10, 10, 16)
    assert (cap.active_sequences, cap.max_sequences) == (0, 4)
    logits = engine.put([1, 2], [list(range(20)), list(range(5))])
    assert logits.shape == (2, 512) and logits.dtype == torch.float32
    cap = engine.capacity()
    assert cap.free_blocks == 10 - 2 - 1 and cap.active_sequences == 2
    assert engine.seen_tokens(1) == 20
    engine.flush(1)
    engine.flush(2)
    assert engine.capacity().free_blocks == 10


def test_query_reports_what_fits(engine: InferenceEngineV2) -> None:
    assert engine.query(5, 100, 100) == (100, 7)
    assert engine.query(5, 100, 2) == (32, 2)  # limited by the blocks offered
    engine.put([5], [list(range(10))])  # holds 1 block, 6 free slots in it
    assert engine.query(5, 6, 0) == (6, 0)
    assert engine.query(5, 50, 1) == (22, 1)
    assert engine.query(5, 1000, 1000) == (150, 9)  # limited by the 9 free blocks


def test_over_budget_put_is_refused_and_changes_nothing(engine: InferenceEngineV2) -> None:
    engine.put([1], [list(range(100))])  # 7 blocks
    before = engine.capacity()
    with pytest.raises(InferenceError, match=r"cannot hold the request.*num_blocks"):
        engine.put([1, 2], [list(range(30)), list(range(40))])
    assert engine.capacity() == before and engine.seen_tokens(1) == 100
    assert 2 not in engine.state
    with pytest.raises(InferenceError, match="max_context"):
        engine.put([1], [list(range(101))])
    with pytest.raises(InferenceError, match="max_ragged_batch_size"):
        engine.put([3], [list(range(257))])
    with pytest.raises(InferenceError, match="outside"):
        engine.put([3], [[512]])
    with pytest.raises(InferenceError, match="same uid"):
        engine.put([3, 3], [[1], [2]])
    with pytest.raises(InferenceError, match="unknown sequence"):
        engine.flush(99)
    assert engine.capacity() == before


def test_tracked_sequence_limit(engine: InferenceEngineV2) -> None:
    engine.put([0, 1, 2, 3], [[1], [2], [3], [4]])
    with pytest.raises(InferenceError, match="max_tracked_sequences"):
        engine.put([4], [[5]])
    engine.flush(0)
    engine.put([4], [[5]])


def test_config_errors_name_the_key() -> None:
    with pytest.raises(ConfigError, match="block_size"):
        EngineConfig.parse({"kv_cache": {"block_size": 0}})
    with pytest.raises(ConfigError, match="blocksize"):
        EngineConfig.parse({"kv_cache": {"blocksize": 16}})
    with pytest.raises(ConfigError, match="either num_blocks or memory_budget_bytes"):
        EngineConfig.parse({"kv_cache": {"num_blocks": 4, "memory_budget_bytes": 1 << 20}})


def test_memory_budget_sizes_the_cache(tiny_dirs: dict[str, Path]) -> None:
    # 2 layers * (k + v) * 16 tokens * 2 kv heads * 16 dims * 4 bytes = 8 KiB per block.
    engine = build_engine(tiny_dirs["qwen2"], {"kv_cache": {"memory_budget_bytes": 80 * 1024}})
    assert engine.capacity().total_blocks == 10
    assert engine.cache.nbytes == 80 * 1024
    with pytest.raises(InferenceError, match="holds no block"):
        build_engine(tiny_dirs["qwen2"], {"kv_cache": {"memory_budget_bytes": 100}})


def test_unknown_model_type_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "mamba"}')
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ConfigError, match="mamba"):
        build_engine(tmp_path)
    with pytest.raises(ConfigError, match=r"config\.json"):
        build_engine(tmp_path / "missing")


def test_kv_utilisation(engine: InferenceEngineV2) -> None:
    engine.put([1], [list(range(24))])  # 24 tokens in 2 blocks of 16
    assert engine.kv_utilisation() == pytest.approx(24 / 32)
