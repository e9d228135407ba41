"""Head counts Ulysses can split, and the registration errors that need no process group."""

from __future__ import annotations

import pytest

from ds.interfaces.errors import ConfigError
from ds.parallel.sequence import check_model_config, kv_replication, register_ulysses_attention


@pytest.mark.parametrize(
    ("heads", "kv", "sp", "copies"),
    [(4, 2, 2, 1), (4, 4, 4, 1), (8, 2, 4, 2), (8, 1, 4, 4), (32, 8, 8, 1), (4, 2, 1, 1)],
)
def test_kv_replication(heads: int, kv: int, sp: int, copies: int) -> None:
    assert kv_replication(heads, kv, sp) == copies


def test_query_heads_not_divisible_names_numbers_and_choices() -> None:
    with pytest.raises(ConfigError) as err:
        kv_replication(6, 2, 4)
    msg = str(err.value)
    assert "sequence_parallel_size=4" in msg
    assert "num_attention_heads=6" in msg
    assert "[1, 2, 3, 6]" in msg


def test_kv_heads_neither_dividing_nor_multiple_refused() -> None:
    with pytest.raises(ConfigError) as err:
        kv_replication(24, 6, 4)
    msg = str(err.value)
    assert "num_key_value_heads=6" in msg and "sequence_parallel_size=4" in msg
    assert "[1, 2, 3, 6, 12, 24]" in msg


def test_bad_sizes() -> None:
    with pytest.raises(ConfigError, match=">= 1"):
        kv_replication(4, 2, 0)
    with pytest.raises(ConfigError, match="num_key_value_heads=3 does not divide"):
        kv_replication(4, 3, 1)


def test_check_model_config_reads_transformers_config() -> None:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(num_attention_heads=8, num_key_value_heads=2, hidden_size=64)
    assert check_model_config(cfg, 4) == 2
    with pytest.raises(ConfigError, match="num_attention_heads=8"):
        check_model_config(cfg, 3)
    plain = transformers.LlamaConfig(
        num_attention_heads=4, num_key_value_heads=None, hidden_size=32
    )
    assert check_model_config(plain, 4) == 1


def test_unknown_core_attention() -> None:
    pytest.importorskip("transformers")
    with pytest.raises(ConfigError, match=r"unknown core attention 'sdap'.*'sdpa'"):
        register_ulysses_attention(None, None, core="sdap")
    with pytest.raises(ConfigError, match="already a Ulysses wrapper"):
        register_ulysses_attention(None, None, core="ulysses_sdpa")
