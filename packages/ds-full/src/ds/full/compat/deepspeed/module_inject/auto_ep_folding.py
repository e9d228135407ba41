"""``deepspeed.module_inject.auto_ep_folding``: the rank layout of expert parallelism folded onto
tensor parallelism (:mod:`ds.parallel.moe.folding`)."""

from ds.parallel.moe.folding import (
    FoldingGroupHandles,
    FoldingGroupTables,
    ParallelFoldingSpec,
    assert_group_matches_spec,
    build_folding_spec,
    expected_folding_group_tables,
    local_folding_ranks,
    validate_folding_global,
)

__all__ = [
    "FoldingGroupHandles",
    "FoldingGroupTables",
    "ParallelFoldingSpec",
    "assert_group_matches_spec",
    "build_folding_spec",
    "expected_folding_group_tables",
    "local_folding_ranks",
    "validate_folding_global",
]
