"""``deepspeed.module_inject.auto_ep_folding``: the rank layout of expert parallelism folded onto
tensor parallelism (:mod:`ds.parallel.moe.folding`)."""

from ds.full.compat.deepspeed._missing import missing_function
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

# DeepSpeed's per-parameter-family gradient reduction under folding (router gates replicated or
# partial across tensor-parallel ranks, sequence-sharded LayerNorms): its strategy names, and the
# marking and reduction calls. ds's folded runtime (ds.parallel.moe.folded) needs none of them: its
# backward leaves replicated weights complete on every TP rank and each route's expert gradient
# counted once, so the ordinary data-parallel reduction applies.
AUTOEP_FOLDING_PARAM_FAMILY_ATTR = "ds_autoep_folding_param_family"
AUTOEP_FOLDING_GRAD_REDUCE_SKIP = "skip"
AUTOEP_FOLDING_GRAD_REDUCE_SUM = "sum"
AUTOEP_FOLDING_GRAD_REDUCE_AVERAGE = "average"
AUTOEP_FOLDING_GRAD_REDUCE_EXPERT_TP_CANCEL = "expert_tp_cancel"

_Q = "deepspeed.module_inject.auto_ep_folding"
_FEATURE = "per-parameter-family gradient reduction for expert parallelism folded onto TP"
_HINT = (
    "ds folds expert onto tensor parallelism with a backward that needs no per-family "
    "reduction (ds.parallel.moe.folded): set expert_parallel.autoep_size with "
    "tensor_parallel.autotp_size and let ds.initialize build it"
)
mark_autoep_folding_router_parameter = missing_function(
    f"{_Q}.mark_autoep_folding_router_parameter", _FEATURE, _HINT
)
mark_autoep_folding_partial_router_parameter = missing_function(
    f"{_Q}.mark_autoep_folding_partial_router_parameter", _FEATURE, _HINT
)
mark_autoep_folding_sp_sharded_layernorm_parameter = missing_function(
    f"{_Q}.mark_autoep_folding_sp_sharded_layernorm_parameter", _FEATURE, _HINT
)
autoep_folding_gradient_reduction_strategy = missing_function(
    f"{_Q}.autoep_folding_gradient_reduction_strategy", _FEATURE, _HINT
)
reduce_autoep_folding_gradient = missing_function(
    f"{_Q}.reduce_autoep_folding_gradient", _FEATURE, _HINT
)
