"""The stage-3 optimizer: steps each rank's parameter partitions, with optional CPU/NVMe offload.

A client ``torch.optim.Optimizer`` built over the model's parameters keeps its hyperparameters and
param groups (so LR schedulers keep working); its ``params`` are replaced by fp32 master partitions.

Where the masters live: on the compute device without offload; on the host with
``offload='cpu'`` (the optimizer the engine builds then steps them with the kernel provider's CPU
kernels) and with ``offload='nvme'`` (masters and moments live in a swap file and are streamed
through the provider's async I/O, reading the next partition while the current one steps).
Gradient partitions are reduced on the compute device; host masters step from explicit host
copies of them, and the updated masters are copied back into the shards.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Literal

import torch

from ds.interfaces.accelerator import Accelerator
from ds.interfaces.errors import ConfigError
from ds.interfaces.kernels import AdamHyper, KernelProvider
from ds.interfaces.logging import get_logger
from ds.zero.param_groups import hyper_params
from ds.zero.stage3.partitioner import Stage3Partitioner
from ds.zero.stage3.shard import shard_of
from ds.zero.stage3.state_stream import StateStream
from ds.zero.stage3.swap import AioSettings, SwapFile, open_aio
from ds.zero.stages.host_pins import HostPins

log = get_logger(__name__)

OffloadDevice = Literal["none", "cpu", "nvme"]


def _adam_hyper(opt: torch.optim.Optimizer, group: dict[str, Any]) -> AdamHyper:
    name = type(opt).__name__.lower()
    unsupported = [k for k in ("amsgrad", "maximize") if group.get(k)]
    if "adam" not in name or "betas" not in group or unsupported:
        raise ConfigError(
            f"NVMe optimizer offload steps Adam/AdamW in the kernel provider; got "
            f"{type(opt).__name__}{' with ' + ', '.join(unsupported) if unsupported else ''}. Use "
            "Adam or AdamW, or set zero_optimization.offload_optimizer.device to 'cpu' or 'none'"
        )
    b1, b2 = group["betas"]
    if "adamw_mode" in group:  # ds's own Adam classes carry the mode in the group
        adamw = bool(group["adamw_mode"])
    else:  # torch.optim.Adam / AdamW
        adamw = name.endswith("adamw") or bool(group.get("decoupled_weight_decay"))
    return AdamHyper(
        lr=float(group["lr"]),
        beta1=float(b1),
        beta2=float(b2),
        eps=float(group["eps"]),
        weight_decay=float(group["weight_decay"]),
        adamw_mode=adamw,
        bias_correction=bool(group.get("bias_correction", True)),
    )


class Stage3Optimizer:
    """Owns gradient partitions and the update of parameter partitions."""

    def __init__(
        self,
        partitioner: Stage3Partitioner,
        groups: list[dict[str, Any]],
        build: Callable[[list[dict[str, Any]]], torch.optim.Optimizer],
        *,
        offload: OffloadDevice = "none",
        kernels: KernelProvider | None = None,
        nvme_path: str | None = None,
        aio: AioSettings | None = None,
        buffer_count: int = 4,
        pin_memory: bool = False,
        accelerator: Accelerator | None = None,
    ) -> None:
        """``groups``: torch-style parameter groups over the module's parameters; ``build`` makes
        the optimizer from the same groups with ``params`` replaced by the master partitions.
        With ``offload="cpu"`` and ``pin_memory`` the host masters are pinned through
        ``accelerator`` and released by :meth:`close`."""
        self.part = partitioner
        self.pins = HostPins(accelerator, offload == "cpu" and pin_memory)
        self.offload = offload
        self.kernels = kernels
        self.step_count = 0
        host = offload in ("cpu", "nvme")
        # Where the fp32 masters (and the moments the optimizer makes like them) live.
        self.master_device = torch.device("cpu") if host else partitioner.coll.device
        self._host_grads: dict[int, torch.Tensor] = {}  # ds_id -> host copy of the partition
        self._masters: dict[int, torch.nn.Parameter] = {}  # ds_id -> fp32 master partition
        self._hyper_groups: list[tuple[dict[str, Any], list[torch.nn.Parameter]]] = []
        known = {id(p) for p in partitioner.params}
        master_groups = []
        originals_of = []
        for group in groups:
            originals = list(group["params"])
            for p in originals:
                if id(p) not in known:
                    raise ConfigError(
                        "the optimizer holds a parameter the stage-3 engine does not manage; build "
                        "the optimizer over engine.module.parameters()"
                    )
            master_groups.append(
                {**hyper_params(group), "params": [self._master(shard_of(p)) for p in originals]}
            )
            originals_of.append(originals)
        optimizer = build(master_groups)
        self.optimizer = optimizer
        for group, originals in zip(optimizer.param_groups, originals_of):
            self._hyper_groups.append((group, originals))
        self._swap: SwapFile | None = None
        self._stream: StateStream | None = None
        if offload == "nvme":
            if not nvme_path:
                raise ConfigError(
                    "zero_optimization.offload_optimizer.nvme_path is required when "
                    "offload_optimizer.device is 'nvme'; set it to a directory on local disk"
                )
            handle = open_aio(kernels, aio or AioSettings())
            rank = partitioner.coll.rank
            self._swap = SwapFile(handle, os.path.join(nvme_path, f"ds_zero3_optim_rank{rank}.swp"))
            self._stream = StateStream(self._swap, buffer_count, pin_memory)
            self._init_nvme()

    # -- state ---------------------------------------------------------------------------------
    def _master(self, s: Any) -> torch.nn.Parameter:
        m = self._masters.get(s.ds_id)
        if m is None:
            dev = self.master_device or s.shard.device
            if s.swapped:
                self.part.swapper.swap_in(s)  # type: ignore[union-attr]
                src = s.shard.to(dev, torch.float32, copy=True)
                self.part.swapper.drop(s)  # type: ignore[union-attr]
            elif "master_src" in s.extra:
                # fp32 values from before a precision cast
                src = s.extra.pop("master_src").to(dev)
            elif s.dtype == torch.float32 and s.shard.device == dev:
                src = s.shard  # the partition itself is the master: no second copy
            else:
                src = s.shard.to(dev, torch.float32, copy=True)
            src = self.pins.pin(src)
            # No autograd on masters: they are stepped in place by optimizers and kernels.
            m = torch.nn.Parameter(src, requires_grad=False)
            self._masters[s.ds_id] = m
            if not self.shares_shard(s):
                # GatheredParameters(modifier_rank=...) edits must reach the master copy too.
                s.extra["on_shard_written"] = self._on_shard_written
        return m

    def shares_shard(self, s: Any) -> bool:
        """Whether ``s``'s master is its shard itself (fp32 shard where the masters live).
        Compared by storage identity, not addresses (simulated tensors have none)."""
        m = self._masters.get(s.ds_id)
        return m is not None and m.data.untyped_storage() is s.shard.untyped_storage()

    def _on_shard_written(self, s: Any, values: torch.Tensor) -> None:
        n = values.numel()
        m = self._masters[s.ds_id].data
        if m.numel() == s.shard_numel:
            m[:n].copy_(values)
        if self._swap is not None:  # the master lives on NVMe: patch it there
            full = torch.zeros(s.shard_numel, dtype=torch.float32)
            self._swap.read((s.ds_id, "m"), full)
            full[:n].copy_(values)
            self._swap.write((s.ds_id, "m"), full)

    def _init_nvme(self) -> None:
        assert self._swap is not None
        for _, originals in self._hyper_groups:
            for p in originals:
                s = shard_of(p)
                m = self._masters[s.ds_id]
                zeros = torch.zeros_like(m.data)
                self._swap.write((s.ds_id, "m"), m.data)
                self._swap.write((s.ds_id, "v"), zeros)
                self._swap.write((s.ds_id, "w"), zeros)
                self._swap.handle.wait()
                s.extra["on_shard_written"] = self._on_shard_written
                # The master lives on NVMe; only the working partition stays in memory.
                if not self.shares_shard(s):
                    m.data = torch.empty(0)

    # -- step ----------------------------------------------------------------------------------
    def zero_grad(self) -> None:
        for p in self.part.params:
            shard_of(p).grad = None

    def step(self) -> None:
        """Update every partition from its reduced gradient (clipping is the engine's)."""
        self.step_count += 1
        if self.offload == "nvme":
            self._step_nvme()
        else:
            self._step_torch()
        self.zero_grad()
        self.part.refresh_persistent()

    def _grad_for(self, s: Any, master: torch.Tensor) -> torch.Tensor:
        """``s``'s gradient partition where ``master`` lives: an explicit copy into a kept host
        buffer when the master is offloaded (the partition was reduced on the device)."""
        g = s.grad
        assert g is not None
        if g.device == master.device:
            return g  # type: ignore[no-any-return]
        buf = self._host_grads.get(s.ds_id)
        if buf is None or buf.numel() != g.numel():
            buf = torch.empty(g.numel(), dtype=g.dtype, device=master.device)
            self._host_grads[s.ds_id] = buf
        buf.copy_(g)  # blocking: the step reads it next
        return buf

    def _write_back(self, s: Any, master: torch.Tensor) -> None:
        if self.part.swapper is not None and s.swapped:
            self.part.swapper.write_back(s, master.to(s.dtype))
        elif master.untyped_storage() is not s.shard.untyped_storage():
            s.shard.copy_(master)

    def _step_torch(self) -> None:
        for _, originals in self._hyper_groups:
            for p in originals:
                s = shard_of(p)
                m = self._masters[s.ds_id]
                m.grad = None if s.grad is None else self._grad_for(s, m.data)
        self.optimizer.step()
        for _, originals in self._hyper_groups:
            for p in originals:
                s = shard_of(p)
                m = self._masters[s.ds_id]
                m.grad = None
                self._write_back(s, m.data)

    def _step_nvme(self) -> None:
        assert self._stream is not None and self.kernels is not None
        work = [
            (group, shard_of(p))
            for group, originals in self._hyper_groups
            for p in originals
            if shard_of(p).grad is not None
        ]

        def step(i: int, m: torch.Tensor, v: torch.Tensor, w: torch.Tensor) -> None:
            assert self.kernels is not None
            group, s = work[i]
            hyper = _adam_hyper(self.optimizer, group)
            self.kernels.adam_step(self.step_count, hyper, m, self._grad_for(s, m), v, w)
            self._write_back(s, m)

        # The kernels step the swapped state, run as optimizer.step's closure (the masters have no
        # .grad, so the optimizer itself updates nothing) so that its step hooks and LR
        # schedulers see a step.
        stream = self._stream

        def run_kernels() -> float:
            stream.run([(s.ds_id, s.shard_numel) for _, s in work], step)
            return 0.0

        self.optimizer.step(run_kernels)

    # -- checkpoint support --------------------------------------------------------------------
    def moments(self, s: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
        """This rank's (exp_avg, exp_avg_sq) partitions of a parameter, if it has stepped."""
        if self.offload == "nvme":
            assert self._swap is not None
            v = torch.empty(s.shard_numel, dtype=torch.float32)
            w = torch.empty(s.shard_numel, dtype=torch.float32)
            self._swap.read((s.ds_id, "v"), v)
            self._swap.read((s.ds_id, "w"), w)
            return v, w
        st = self.optimizer.state.get(self._masters[s.ds_id])
        if not st or "exp_avg" not in st:
            return None
        return st["exp_avg"], st["exp_avg_sq"]

    def restore(
        self,
        s: Any,
        master: torch.Tensor,
        moments: list[torch.Tensor | None],
        scalars: dict[str, Any],
    ) -> None:
        """Load one parameter's fp32 master partition and optimizer moments (checkpoint load)."""
        m = self._masters[s.ds_id]
        v, w = moments
        if self._swap is not None:
            zeros = torch.zeros_like(master)
            self._swap.write((s.ds_id, "m"), master)
            self._swap.write((s.ds_id, "v"), v if v is not None else zeros)
            self._swap.write((s.ds_id, "w"), w if w is not None else zeros)
            self._swap.handle.wait()
        if m.data.numel() == master.numel():
            m.data.copy_(master)
        self._write_back(s, master)
        if v is None or w is None:
            return
        if self._swap is None:
            state = {
                k: (t.clone() if isinstance(t, torch.Tensor) else t) for k, t in scalars.items()
            }
            # Moments live beside the master (checkpoints load them on the host).
            dev = m.data.device
            self.optimizer.state[m] = {**state, "exp_avg": v.to(dev), "exp_avg_sq": w.to(dev)}

    def close(self) -> None:
        self.pins.release()
        if self._swap is not None:
            self._swap.handle.wait()
            self._swap.close()


def repoint(
    optimizer: torch.optim.Optimizer,
) -> Callable[[list[dict[str, Any]]], torch.optim.Optimizer]:
    """A ``build`` that re-points an existing optimizer's groups at the master partitions, keeping
    the object (and any LR scheduler attached to it)."""

    def build(groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
        optimizer.state.clear()
        optimizer.param_groups.clear()
        for g in groups:
            optimizer.add_param_group(g)
        return optimizer

    return build
