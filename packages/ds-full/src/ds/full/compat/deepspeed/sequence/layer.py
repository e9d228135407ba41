"""``deepspeed.sequence.layer``: ``DistributedAttention`` and ``apply_rotary_pos_emb`` on
ds.parallel.sequence."""

from __future__ import annotations

from typing import Any

from ds.parallel.sequence import DistributedAttention as _DistributedAttention
from ds.parallel.sequence import apply_rotary_pos_emb
from ds.parallel.sequence import rotate_half as _rotate_half

# DeepSpeed takes a fused path through the optional ``torchembed`` package when it is installed;
# ds always applies the rotation in plain torch, so that path is never taken.
_torchembed_available = False


class DistributedAttention(_DistributedAttention):
    """DeepSpeed's signature: ``DistributedAttention(local_attention, sequence_process_group,
    scatter_idx=2, gather_idx=0)``; the collectives go through ``ds.comm``."""

    def __init__(
        self,
        local_attention: Any,
        sequence_process_group: Any,
        scatter_idx: int = 2,
        gather_idx: int = 0,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        from ds import comm

        super().__init__(
            local_attention,
            comm.get_communicator(),
            sequence_process_group,
            scatter_idx=scatter_idx,
            gather_idx=gather_idx,
        )


__all__ = ["DistributedAttention", "_rotate_half", "_torchembed_available", "apply_rotary_pos_emb"]
