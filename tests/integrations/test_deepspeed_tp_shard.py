"""deepspeed.module_inject.tp_shard: AutoTP's split sizes tile the dimension."""

from __future__ import annotations


def test_autotp_shard_sizes_tile_the_dimension() -> None:
    from ds.full.compat.deepspeed.module_inject.tp_shard import AutoTPMeta, get_shard_size_list

    assert get_shard_size_list(10, 4, AutoTPMeta(), "lm_head") == [3, 3, 2, 2]
    # whole key/value heads: 3 heads of 4 rows over 2 ranks; MLP projections split evenly
    assert get_shard_size_list(12, 2, AutoTPMeta(num_kv_heads=3), "q_proj") == [8, 4]
    assert get_shard_size_list(12, 2, AutoTPMeta(num_kv_heads=3), "mlp.up_proj") == [6, 6]
    assert get_shard_size_list(130, 2, AutoTPMeta(tp_grain_size=64)) == [64, 66]
