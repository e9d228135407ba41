"""``deepspeed.checkpoint.autoep_universal``: AutoEP expert weights in a universal checkpoint
(:mod:`ds.checkpoint.universal_autoep`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

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
    from the ZeRO-1/2 fragments a conversion's first pass wrote."""
    consolidate_zero12_expert_states(
        temp_dir,
        output_dir,
        expert_param_info,
        slice_shapes,
        dp_degree,
        tp_degree,
        use_data_before_expert_parallel,
    )


__all__ = ["_zero12_fragment_path", "consolidate_autoep_zero12_expert_states"]
