"""``deepspeed.module_inject.auto_ep_folding``: the rank layout of expert parallelism folded onto
tensor parallelism (:mod:`ds.parallel.moe.folding`)."""

from ds.parallel.moe import folding as _folding
from ds.parallel.moe.folding import FoldingGroupHandles as FoldingGroupHandles
from ds.parallel.moe.folding import FoldingGroupTables as FoldingGroupTables
from ds.parallel.moe.folding import ParallelFoldingSpec as ParallelFoldingSpec
from ds.parallel.moe.folding import assert_group_matches_spec as assert_group_matches_spec
from ds.parallel.moe.folding import build_folding_spec as build_folding_spec
from ds.parallel.moe.folding import expected_folding_group_tables as expected_folding_group_tables
from ds.parallel.moe.folding import local_folding_ranks as local_folding_ranks
from ds.parallel.moe.folding import validate_folding_global as validate_folding_global

# The owner's public names, less ``divisors``, which DeepSpeed's module does not have.
__all__ = [name for name in _folding.__all__ if name != "divisors"]
