"""``deepspeed.checkpoint.autoep_universal``: AutoEP expert weights in a universal checkpoint
(:mod:`ds.checkpoint.universal_autoep`)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from ds.checkpoint.autoep_files import (
    consolidate_expert_files,
    make_folding_metadata,
    validate_folding_metadata,
)
from ds.checkpoint.autoep_files import expert_file as resolve_expert_ckpt_path
from ds.checkpoint.universal_autoep import consolidate_zero12_expert_states, expert_dp_ranks
from ds.checkpoint.universal_autoep import fragment_path as _zero12_fragment_path


def _autoep_zero12_dp_ranks(
    ep_rank: int, dp_degree: int, ep_size: int, use_data_before_expert_parallel: bool
) -> range:
    return expert_dp_ranks(ep_rank, dp_degree, ep_size, use_data_before_expert_parallel)


def consolidate_autoep_zero12_expert_states(
    temp_dir: str,
    output_dir: str,
    expert_param_info: Mapping[str, Mapping[str, Any]],
    slice_shapes: Mapping[str, Sequence[int]],
    dp_degree: int,
    tp_degree: int,
    use_data_before_expert_parallel: bool,
    fp32_fallback_dir: str | None = None,
) -> None:
    """Each expert parameter's fp32 value, Adam moments and step, stacked over all experts,
    from the ZeRO-1/2 fragments a conversion's first pass wrote (every value is taken from
    them, so ``fp32_fallback_dir`` is not read)."""
    consolidate_zero12_expert_states(
        temp_dir,
        output_dir,
        expert_param_info,
        slice_shapes,
        dp_degree,
        tp_degree,
        use_data_before_expert_parallel,
    )


def consolidate_autoep_expert_files(
    checkpoint_dir: str,
    output_dir: str,
    autoep_layers_metadata: Any,
    fp32_fallback_param_names: Collection[str] | None = None,
    fp32_fallback_dir: str | None = None,
) -> None:
    """The per-expert model files of each AutoEP layer stacked into whole expert weights."""
    consolidate_expert_files(
        checkpoint_dir,
        output_dir,
        autoep_layers_metadata,
        only=fp32_fallback_param_names,
        fp32_dir=fp32_fallback_dir if fp32_fallback_param_names is not None else None,
    )


__all__ = [
    "_zero12_fragment_path",
    "consolidate_autoep_expert_files",
    "consolidate_autoep_zero12_expert_states",
    "make_folding_metadata",
    "resolve_expert_ckpt_path",
    "validate_folding_metadata",
]
