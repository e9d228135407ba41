"""``deepspeed.checkpoint.reshape_meg_2d``: the (pipeline, tensor) grid of model-state files and
its shrinking (:mod:`ds.checkpoint.rank_layout`)."""

from __future__ import annotations

from ds.checkpoint.rank_layout import RankMap2D as meg_2d_parallel_map
from ds.checkpoint.rank_layout import partition_data


def reshape_meg_2d_parallel(
    old_pp_degree: int,
    old_tp_degree: int,
    new_pp_degree: int,
    new_tp_degree: int,
    verbose: bool = False,
) -> meg_2d_parallel_map:
    from ds.checkpoint.rank_layout import reshape_2d

    grid = reshape_2d(old_pp_degree, old_tp_degree, new_pp_degree, new_tp_degree)
    if verbose:
        grid.print_data("final_2d_map:")
    return grid


__all__ = ["meg_2d_parallel_map", "partition_data", "reshape_meg_2d_parallel"]
