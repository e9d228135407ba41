"""Stage 3 assembled: partitioner + optimizer behind the calls a training engine makes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ds.interfaces.checkpoint import ShardedStateDict, ShardedTensor, TensorMeta
from ds.interfaces.comm import Communicator
from ds.interfaces.kernels import KernelProvider
from ds.zero.stage3.collectives import Collectives
from ds.zero.stage3.optimizer import OffloadDevice, Stage3Optimizer
from ds.zero.stage3.partitioner import Stage3Limits, Stage3Partitioner
from ds.zero.stage3.shard import ParamStatus, shard_of
from ds.zero.stage3.swap import AioSettings, ParamSwapper, open_aio


@dataclass(frozen=True)
class OffloadSettings:
    param_device: OffloadDevice = "none"
    optimizer_device: OffloadDevice = "none"
    param_nvme_path: str | None = None
    optimizer_nvme_path: str | None = None
    max_in_cpu: int = 1_000_000_000
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
            )
        self.partitioner = Stage3Partitioner(module, self.coll, limits, swapper)
        self.optimizer = Stage3Optimizer(
            self.partitioner,
            optimizer,
            offload=offload.optimizer_device,
            kernels=kernels,
            nvme_path=offload.optimizer_nvme_path,
            aio=offload.aio,
            gradient_clipping=gradient_clipping,
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
        """Full module state dict (parameters gathered one at a time, buffers as they are).

        Every rank must call it (it gathers); every rank receives the full tensors.
        """
        out: dict[str, torch.Tensor] = {}
        for name, p in self.module.named_parameters():
            s = shard_of(p)
            was = s.status
            if was is not ParamStatus.AVAILABLE:
                self.partitioner.gather_all([p])
            t = p.data.detach().clone()
            out[name] = t.to(dtype) if dtype is not None else t
            if was is not ParamStatus.AVAILABLE:
                self.partitioner.release([p])
        for name, b in self.module.named_buffers():
            out[name] = b.detach().clone()
        return out

    # -- checkpoints ---------------------------------------------------------------------------
    def sharded_state(self) -> ShardedStateDict:
        """This rank's parameter and Adam-moment partitions as element ranges of full tensors."""
        sd = ShardedStateDict()
        for p in self.partitioner.params:
            s = shard_of(p)
            n = s.valid_numel
            master = self.optimizer._masters[s.ds_id].data
            if master.numel() == 0 or s.swapped:
                master = self._master_copy(s)
            dt = str(torch.float32).removeprefix("torch.")
            meta = TensorMeta(f"module.{s.name}", tuple(s.shape), dt)
            sd.tensors[meta.name] = ShardedTensor(meta, s.offset, master[:n].detach().clone())
            mom = self.optimizer.moments(s)
            if mom is not None:
                for key, t in zip(("exp_avg", "exp_avg_sq"), mom):
                    m2 = TensorMeta(f"optimizer.{key}.{s.name}", tuple(s.shape), dt)
                    sd.tensors[m2.name] = ShardedTensor(m2, s.offset, t[:n].detach().clone())
        for name, b in self.module.named_buffers():
            sd.objects[f"buffer.{name}"] = b.detach().clone()
        sd.objects["optimizer.step"] = self.optimizer.step_count
        return sd

    def _master_copy(self, s: Any) -> torch.Tensor:
        if self.optimizer._swap is not None:
            buf = torch.empty(s.shard_numel, dtype=torch.float32)
            self.optimizer._swap.read((s.ds_id, "m"), buf)
            return buf
        assert self.partitioner.swapper is not None
        self.partitioner.swapper.swap_in(s)
        out = s.shard.float().clone()
        self.partitioner.swapper.drop(s)
        return out

    def close(self) -> None:
        self.optimizer.close()
        if self.partitioner.swapper is not None:
            self.partitioner.swapper.close()
