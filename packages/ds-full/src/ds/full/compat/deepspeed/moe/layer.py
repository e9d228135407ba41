"""``deepspeed.moe.layer.MoE``: ds's mixture-of-experts layer (:mod:`ds.parallel.moe`).

Build it as in DeepSpeed (before or after ``init_distributed``); ``deepspeed.initialize`` binds it
to its expert-parallel groups, or ``set_deepspeed_parallelism()`` does so on the job's
communicator."""

from __future__ import annotations

from typing import Any

from ds.parallel.moe.layer import MoE as _MoE


class MoE(_MoE):
    __doc__ = _MoE.__doc__

    def set_deepspeed_parallelism(self, comm: Any = None, **_: Any) -> None:
        # DeepSpeed's keyword (use_data_before_expert_parallel_) does not change ds's layout.
        if comm is None:
            from ds import comm as dist

            comm = dist.get_communicator()
        self.bind(comm)


__all__ = ["MoE"]
