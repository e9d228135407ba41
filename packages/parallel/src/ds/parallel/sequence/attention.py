"""Ulysses attention: all-to-all sequence <-> heads around an unchanged core attention.

Each rank holds ``seq / sp`` tokens of every sample with all heads. Before attention one
all-to-all gives each rank the full sequence for ``heads / sp`` heads, the core attention runs
exactly as on one process (causal masking is over the whole sequence), and a second all-to-all
returns this rank's tokens with all heads. Gradients take the reverse path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ds.interfaces.errors import ConfigError
from ds.parallel.sequence._all_to_all import seq_all_to_all
from ds.parallel.sequence.heads import kv_replication

# Per-token kwargs of this rank's shard that flash cores read (to find packed sequences) and so
# need for the full sequence; sdpa and eager ignore them, so they are gathered only for flash.
FLASH_GATHERED_KWARGS = ("position_ids",)


class _GroupedModule:
    """The attention module as the core sees it after kv-head replication: only the head ratio
    (``num_key_value_groups``) differs; everything else is the module's own."""

    def __init__(self, module: Any, groups: int) -> None:
        object.__setattr__(self, "_module", module)
        object.__setattr__(self, "num_key_value_groups", groups)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


@dataclass(eq=False, repr=False)
class UlyssesAttention:
    """A transformers attention-interface function that runs ``core`` sequence-parallel.

    Call signature and layouts are transformers': ``(module, query, key, value, attention_mask,
    **kwargs) -> (attn_output, attn_weights)`` with q/k/v ``[batch, heads, seq_local, head_dim]``
    and ``attn_output`` ``[batch, seq_local, heads, head_dim]``; ``attn_weights`` is whatever the
    core returns for this rank's heads (``None`` for sdpa).

    ``attention_mask`` must be ``None`` (the model then relies on the core's causal mask over the
    full sequence: transformers builds no mask for an implementation it has no mask function for)
    or a 4-D mask already covering the full sequence with one head. Padding belongs on the right,
    where causal attention never lets a real token see it; :class:`UlyssesDataLoaderAdapter`
    checks that and drops the 2-D mask.
    """

    core: Callable[..., Any]
    comm: Any
    sp_group: Any
    gathered_kwargs: tuple[str, ...] = ()
    # Cores that apply no causal mask of their own when given none (eager) get an additive
    # causal mask over the full sequence.
    causal_mask: bool = False

    def __post_init__(self) -> None:
        self.sp_size = int(self.comm.get_world_size(self.sp_group))

    def _a2a(self, x: torch.Tensor, scatter_dim: int, gather_dim: int) -> torch.Tensor:
        return seq_all_to_all(self.comm, self.sp_group, x, scatter_dim, gather_dim)

    def _gather_seq(self, t: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(t) for _ in range(self.sp_size)]
        self.comm.all_gather(parts, t.contiguous(), group=self.sp_group)
        return torch.cat(parts, dim=-1)

    def __call__(
        self,
        module: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        *args: Any,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, Any]:
        sp = self.sp_size
        if sp == 1:
            result: tuple[torch.Tensor, Any] = self.core(
                module, query, key, value, attention_mask, *args, **kwargs
            )
            return result
        heads, kv_heads = query.shape[1], key.shape[1]
        copies = kv_replication(heads, kv_heads, sp)
        if copies > 1:
            # Fewer kv heads than ranks: replicate each so every rank gets one (the backward of
            # repeat_interleave sums the copies' gradients back into the original head).
            key = key.repeat_interleave(copies, dim=1)
            value = value.repeat_interleave(copies, dim=1)
            module = _GroupedModule(module, heads // key.shape[1])
        seq_full = query.shape[2] * sp
        if attention_mask is not None:
            shape = tuple(attention_mask.shape)
            if attention_mask.dim() != 4 or shape[1] != 1 or shape[-2:] != (seq_full, seq_full):
                raise ConfigError(
                    f"Ulysses attention got an attention mask of shape {shape}; it needs None "
                    f"(causal) or [batch, 1, {seq_full}, {seq_full}] for the full sequence. Do not "
                    "pass the 2-D padding mask to the model (pad on the right; "
                    "UlyssesDataLoaderAdapter drops it)"
                )
        for name in self.gathered_kwargs:
            if isinstance(kwargs.get(name), torch.Tensor):
                kwargs[name] = self._gather_seq(kwargs[name])
        # [b, h, s/sp, d] -> [b, h/sp, s, d]
        q = self._a2a(query, 1, 2)
        k = self._a2a(key, 1, 2)
        v = self._a2a(value, 1, 2)
        if self.causal_mask and attention_mask is None and getattr(module, "is_causal", True):
            future = torch.ones(seq_full, seq_full, dtype=torch.bool, device=q.device).triu(1)
            attention_mask = torch.zeros(
                1, 1, seq_full, seq_full, dtype=q.dtype, device=q.device
            ).masked_fill(future, torch.finfo(q.dtype).min)
        out, weights = self.core(module, q, k, v, attention_mask, *args, **kwargs)
        # core output [b, s, h/sp, d] -> [b, s/sp, h, d]
        return self._a2a(out, 1, 2), weights


class DistributedAttention(torch.nn.Module):
    """DeepSpeed's ``deepspeed.sequence.layer.DistributedAttention`` contract.

    ``local_attention(query, key, value, *args, **kwargs)`` receives tensors whose
    ``gather_idx`` dimension (the sequence, default 0: ``[seq, batch, heads, dim]``) is full and
    whose ``scatter_idx`` dimension (the heads, default 2) is this rank's ``1/sp`` share; its output
    has the same layout and is returned with the sequence sharded and all heads again.
    """

    def __init__(
        self,
        local_attention: Callable[..., torch.Tensor],
        comm: Any,
        sp_group: Any,
        scatter_idx: int = 2,
        gather_idx: int = 0,
    ) -> None:
        super().__init__()
        self.local_attn = local_attention
        self.comm = comm
        self.sp_group = sp_group
        self.scatter_idx = scatter_idx
        self.gather_idx = gather_idx

    def forward(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any, **kwargs: Any
    ) -> torch.Tensor:
        sp = int(self.comm.get_world_size(self.sp_group))
        for name, t in (("query", query), ("key", key), ("value", value)):
            if t.shape[self.scatter_idx] % sp:
                raise ConfigError(
                    f"{name} has {t.shape[self.scatter_idx]} heads (dimension {self.scatter_idx}), "
                    f"which do not divide by sequence_parallel_size={sp}"
                )
        s, g = self.scatter_idx, self.gather_idx
        q, k, v = (seq_all_to_all(self.comm, self.sp_group, t, s, g) for t in (query, key, value))
        context = self.local_attn(q, k, v, *args, **kwargs)
        return seq_all_to_all(self.comm, self.sp_group, context, g, s)


__all__ = ["FLASH_GATHERED_KWARGS", "DistributedAttention", "UlyssesAttention"]
