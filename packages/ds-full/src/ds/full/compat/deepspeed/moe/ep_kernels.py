"""``deepspeed.moe.ep_kernels``: DeepSpeed's Triton permutation kernels for grouped GEMMs.

ds runs each expert's rows with one matmul (``GroupedExperts``) and sorts rows by expert with
``torch.argsort``, so it has no such kernels; the names raise when used."""

from __future__ import annotations

from ds.full.compat.deepspeed._missing import missing_function

_HINT = "ds sorts routed rows with torch ops (ds.parallel.moe); no kernel is needed"
generate_permute_indices = missing_function(
    "deepspeed.moe.ep_kernels.generate_permute_indices", "grouped-GEMM permutation kernels", _HINT
)
permute_rows = missing_function(
    "deepspeed.moe.ep_kernels.permute_rows", "grouped-GEMM permutation kernels", _HINT
)
unpermute_rows = missing_function(
    "deepspeed.moe.ep_kernels.unpermute_rows", "grouped-GEMM permutation kernels", _HINT
)

__all__ = ["generate_permute_indices", "permute_rows", "unpermute_rows"]
