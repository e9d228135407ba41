"""Paged attention for decode steps on CPU (the native kernel ``paged_decode_attention``).

One query token per sequence attends to the first ``context_lens[s]`` positions of its sequence
in a blocked KV cache ``[kv_heads, num_blocks, block_size, head_dim]``, read in place through
``block_tables[s]`` (no gathered copy). fp32 only; no sliding window, softcapping or ALiBi (the
PyTorch path in ds.inference has those). The kernel follows that path's operation order
((q . k) * scale, exp(s - max), / sum, probabilities times v in key order) with its own exp
(about 1 ulp), so results agree with it to fp32 rounding; every SIMD variant gives the same bits.
"""

from __future__ import annotations

import torch

from ds.interfaces.errors import KernelError


def paged_decode_applies(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """Whether :func:`paged_decode` takes these tensors (fp32, CPU, contiguous)."""
    return all(
        t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous()
        for t in (q, k_cache, v_cache)
    )


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 block_tables: torch.Tensor, context_lens: torch.Tensor,
                 scale: float) -> torch.Tensor:  # fmt: skip
    """``q`` [S, heads, d] -> attention output [S, heads, d] (see the module docstring)."""
    if not paged_decode_applies(q, k_cache, v_cache) or q.dim() != 3 or k_cache.dim() != 4:
        raise KernelError(
            "paged_decode takes contiguous fp32 CPU tensors: q [S, heads, d], caches "
            f"[kv_heads, blocks, block_size, d]; got q {tuple(q.shape)} {q.dtype} on "
            f"{q.device}, cache {tuple(k_cache.shape)} {k_cache.dtype}"
        )
    s, h, d = q.shape
    kvh, nb, bs, dk = k_cache.shape
    if v_cache.shape != k_cache.shape or dk != d or h % kvh != 0:
        raise KernelError(
            f"paged_decode: q {tuple(q.shape)} does not fit caches {tuple(k_cache.shape)} / "
            f"{tuple(v_cache.shape)} (head_dim equal, heads a multiple of kv heads)"
        )
    tables = block_tables.to(torch.int32).contiguous()
    ctx = context_lens.to(torch.int64).contiguous()
    if tables.dim() != 2 or tables.shape[0] != s or ctx.shape != (s,):
        raise KernelError(
            f"paged_decode: {s} queries need block_tables [{s}, max_blocks] and context_lens "
            f"[{s}]; got {tuple(block_tables.shape)} and {tuple(context_lens.shape)}"
        )
    from ds.ops._native import native, sync_threads

    sync_threads()
    out = torch.empty_like(q)
    native().paged_decode_attention(
        q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(), ctx.data_ptr(),
        out.data_ptr(), s, h, d, kvh, nb, bs, tables.shape[1], float(scale),
    )  # fmt: skip
    return out
