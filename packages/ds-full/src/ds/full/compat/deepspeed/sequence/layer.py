"""``deepspeed.sequence.layer.DistributedAttention`` on ds.parallel.sequence."""

from __future__ import annotations

from typing import Any

from ds.parallel.sequence import DistributedAttention as _DistributedAttention


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


__all__ = ["DistributedAttention"]
