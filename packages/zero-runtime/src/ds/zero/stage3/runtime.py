"""Stage 3 assembled: partitioner + optimizer behind the calls a training engine makes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ds.interfaces.checkpoint import ShardedStateDict
from ds.interfaces.comm import Communicator
from ds.interfaces.kernels import KernelProvider
from ds.zero.stage3.collectives import Collectives
from ds.zero.stage3.consolidate import consolidated_state_dict
from ds.zero.stage3.optimizer import OffloadDevice, Stage3Optimizer, repoint
from ds.zero.stage3.partitioner import Stage3Limits, Stage3Partitioner
from ds.zero.stage3.state import load_state, save_state
from ds.zero.stage3.swap import AioSettings, ParamSwapper, open_aio


@dataclass(frozen=True)
class OffloadSettings:
    param_device: OffloadDevice = "none"
    optimizer_device: OffloadDevice = "none"
    param_nvme_path: str | None = None
    optimizer_nvme_path: str | None = None
    max_in_cpu: int = 1_000_000_000
    param_buffer_count: int = 5  # NVMe swap-in buffers (reads in flight + read, not gathered)
    optimizer_buffer_count: int = 4  # NVMe optimizer-state buffer sets (read ahead + stepping)
    pin_memory: bool = False
    aio: AioSettings = field(default_factory=AioSettings)


class Stage3Runtime:
    """What the engine drives for ``zero_optimization.stage == 3``."""

    def __init__(
        self,
        module: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        comm: Communicator | None,
        *,
        group: Any = None,
        limits: Stage3Limits | None = None,
        offload: OffloadSettings | None = None,
        kernels: KernelProvider | None = None,
        gradient_clipping: float = 0.0,
        check_order: bool = True,
    ) -> None:
        offload = offload or OffloadSettings()
        self.module = module
        self.coll = Collectives(comm, group, check_order=check_order)
        swapper = None
        if offload.param_device == "nvme":
            swapper = ParamSwapper(
                open_aio(kernels, offload.aio),
                offload.param_nvme_path or "",
                self.coll.rank,
                max_in_cpu=offload.max_in_cpu if offload.max_in_cpu < 1_000_000_000 else 0,
                buffer_count=offload.param_buffer_count,
                pin_memory=offload.pin_memory,
            )
        self.partitioner = Stage3Partitioner(module, self.coll, limits, swapper)
        self.optimizer = Stage3Optimizer(
            self.partitioner,
            [dict(g) for g in optimizer.param_groups],
            repoint(optimizer),
            offload=offload.optimizer_device,
            kernels=kernels,
            nvme_path=offload.optimizer_nvme_path,
            aio=offload.aio,
            gradient_clipping=gradient_clipping,
            buffer_count=offload.optimizer_buffer_count,
            pin_memory=offload.pin_memory,
        )

    # -- training ------------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, retain_graph: bool = False) -> None:
        loss.backward(retain_graph=retain_graph)
        self.partitioner.after_backward()

    def step(self) -> float | None:
        return self.optimizer.step()

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()

    @property
    def accounting(self) -> Any:
        return self.partitioner.acct

    # -- weights -------------------------------------------------------------------------------
    def consolidated_state_dict(self, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """Full module state dict; every rank must call it (it gathers) and receives it all."""
        return consolidated_state_dict(self.partitioner, dtype)

    # -- checkpoints ---------------------------------------------------------------------------
    def sharded_state(self) -> ShardedStateDict:
        """This rank's weight and optimizer partitions as element ranges of full tensors."""
        return save_state(self.optimizer)

    def load_sharded_state(self, state: ShardedStateDict) -> None:
        load_state(self.optimizer, state)

    def close(self) -> None:
        self.optimizer.close()
        if self.partitioner.swapper is not None:
            self.partitioner.swapper.close()
