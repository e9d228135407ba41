"""Which head counts Ulysses can split, checked before a model is allocated."""

from __future__ import annotations

from typing import Any

from ds.interfaces.errors import ConfigError


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def kv_replication(num_heads: int, num_kv_heads: int, sp_size: int) -> int:
    """How many copies of each key/value head the all-to-all needs (1: none).

    Query heads must divide by ``sp_size``. Key/value heads either divide by it (each rank gets
    ``num_kv_heads // sp_size``) or, when there are fewer kv heads than ranks and ``sp_size`` is a
    multiple of them, each is replicated ``sp_size // num_kv_heads`` times so every rank gets one
    (as DeepSpeed's ALST does); anything else is refused with the numbers and the fix.
    """
    if sp_size < 1:
        raise ConfigError(f"sequence_parallel_size must be >= 1, got {sp_size}")
    if num_heads % sp_size:
        raise ConfigError(
            f"sequence_parallel_size={sp_size} does not divide num_attention_heads={num_heads}: "
            f"Ulysses gives each rank num_attention_heads / sequence_parallel_size heads; choose "
            f"sequence_parallel_size in {_divisors(num_heads)}"
        )
    if num_kv_heads <= 0 or num_heads % num_kv_heads:
        raise ConfigError(
            f"num_key_value_heads={num_kv_heads} does not divide num_attention_heads={num_heads}"
        )
    if num_kv_heads % sp_size == 0:
        return 1
    if num_kv_heads < sp_size and sp_size % num_kv_heads == 0:
        return sp_size // num_kv_heads
    ok = sorted(
        set(_divisors(num_kv_heads)) | {m for m in _divisors(num_heads) if m % num_kv_heads == 0}
    )
    raise ConfigError(
        f"sequence_parallel_size={sp_size} cannot split num_key_value_heads={num_kv_heads}: it must "
        f"divide them, or be a multiple of them (then each kv head is replicated); choose "
        f"sequence_parallel_size in {ok}"
    )


def check_model_config(model_config: Any, sp_size: int) -> int:
    """:func:`kv_replication` for a transformers config (``num_attention_heads`` and
    ``num_key_value_heads``, which defaults to the former); call it before building the model."""
    text = getattr(model_config, "get_text_config", None)
    cfg = text() if callable(text) else model_config
    heads = getattr(cfg, "num_attention_heads", None)
    if heads is None:
        raise ConfigError(
            f"{type(model_config).__name__} has no num_attention_heads; Ulysses sequence "
            "parallelism needs a model whose attention heads it can split"
        )
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    return kv_replication(int(heads), int(kv), sp_size)


__all__ = ["check_model_config", "kv_replication"]
