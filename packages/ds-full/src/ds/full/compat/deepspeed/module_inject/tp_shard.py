"""``deepspeed.module_inject.tp_shard``: how AutoTP splits one dimension over a tensor-parallel
group when it does not divide evenly.

The split follows the model's key/value heads when their count divides the dimension (attention
projections: each rank gets whole heads, the lowest ranks one more), else whole grains of
``tp_grain_size`` elements, the lowest ranks one grain more and the last rank any tail. ``lm_head``
/ ``embed_out`` and MLP/MoE projections are never split by heads. The sizes always tile the
dimension exactly, which is what lets a universal checkpoint put the slices back together.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# key/value head counts in probe order; the query-head names last (plain attention: kv == q)
_KV_HEAD_ATTRS = (
    "num_key_value_heads",
    "num_kv_heads",
    "multi_query_group_num",
    "n_head_kv",
    "kv_n_heads",
    "num_attention_heads",
    "n_heads",
    "attention_heads",
)
_ATTN_HEAD_ATTRS = ("num_attention_heads", "num_heads", "n_heads", "n_head", "attention_heads")
_LAST_LINEAR = ("lm_head", "embed_out")
_MLP_NAMES = ("gate_proj", "up_proj", "down_proj", "w1", "w2", "w3")


def _first(config: Any, names: tuple[str, ...]) -> int | None:
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return int(value)
    return None


@dataclass(frozen=True)
class AutoTPMeta:
    """A model's head counts and split grain, read once from its config."""

    num_kv_heads: int | None = None
    num_attention_heads: int | None = None
    n_embd: int | None = None
    tp_grain_size: int = 1

    @classmethod
    def from_model_config(cls, model_config: Any, tp_grain_size: int = 1) -> AutoTPMeta:
        if model_config is None:
            return cls(tp_grain_size=tp_grain_size)
        # vision-language configs keep the text model's counts under text_config
        config = getattr(model_config, "text_config", None) or model_config
        return cls(
            num_kv_heads=_first(config, _KV_HEAD_ATTRS),
            num_attention_heads=_first(config, _ATTN_HEAD_ATTRS),
            n_embd=_first(config, ("n_embd", "hidden_size")),
            tp_grain_size=tp_grain_size,
        )


def _meta_and_name(meta: Any, name: Any) -> tuple[AutoTPMeta, Any]:
    # older callers pass the layer name third, without a meta
    if meta is None or isinstance(meta, str):
        return AutoTPMeta(), meta if name is None else name
    return meta, name


def get_shard_size(
    total_size: int,
    mp_size: int,
    meta: Any = None,
    name: Any = None,
    rank: int | None = None,
    mp_group: Any = None,
) -> int:
    """The size rank ``rank`` (within the tensor-parallel group) holds of ``total_size``."""
    meta, name = _meta_and_name(meta, name)
    if rank is None:
        from ds.full.compat.deepspeed import comm as dist

        if mp_group is not None:
            rank = dist.get_rank(group=mp_group)
        elif dist.get_world_size() != mp_size:
            raise ValueError(
                f"get_shard_size needs a group-local rank or process group when mp_size ({mp_size}) "
                f"differs from the world size ({dist.get_world_size()})"
            )
        else:
            rank = dist.get_rank()
    text = str(name)
    by_heads = (
        meta.num_kv_heads is not None
        and total_size % meta.num_kv_heads == 0
        and "mlp" not in text
        and text not in _LAST_LINEAR
        and not (name is not None and any(s in text for s in _MLP_NAMES))
    )
    if by_heads:
        heads = meta.num_kv_heads
        assert heads is not None
        mine = heads // mp_size + (1 if rank < heads % mp_size else 0)
        return total_size * mine // heads
    grain = meta.tp_grain_size
    if total_size < grain:
        return total_size // mp_size + (1 if rank < total_size % mp_size else 0)
    grains, tail = divmod(total_size, grain)
    size = (grains // mp_size + (1 if rank < grains % mp_size else 0)) * grain
    return size + tail if rank == mp_size - 1 else size


def get_shard_size_list(
    total_size: int, mp_size: int, meta: Any = None, name: Any = None
) -> list[int]:
    """Every rank's size; they sum to ``total_size``."""
    sizes = [get_shard_size(total_size, mp_size, meta, name, r) for r in range(mp_size)]
    if sum(sizes) != total_size:
        raise AssertionError(
            f"AutoTP shard sizes {sizes} for layer {name!r} do not sum to the dimension size "
            f"{total_size} with tp_size={mp_size}"
        )
    return sizes


__all__ = ["AutoTPMeta", "get_shard_size", "get_shard_size_list"]
