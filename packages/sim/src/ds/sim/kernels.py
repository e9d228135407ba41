"""Kernel providers for the simulated GPU world: the real providers' contracts on fake tensors.

Native kernels read tensor memory through DLPack, and fake tensors have none, so under
:func:`ds.sim.world.run_world` the ``cpu`` and ``cuda`` entries of ``ds.kernels`` are these:
the same optimizer updates written as torch ops that allocate what a fused kernel allocates:
nothing (a whole-tensor temporary such as ``exp_avg_sq.sqrt()`` would add a full fp32 copy of
the state to every simulated step's peak). On fake tensors, which hold no values, the ops run in
place on the states themselves; real tensors are updated exactly, in slices of ``_CHUNK``
elements whose temporaries are small. Plus the placement rule each real provider imposes: the
``cpu`` provider refuses any tensor that is not on the host (a host kernel handed a device
tensor is the bug it catches), the ``cuda`` provider any tensor not on the rank's device. NVMe
I/O handles check that buffers are host tensors and count the bytes each file would receive;
reads return nothing (no values) but mark the buffer written (a CPU rank pays for written pages).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch

from ds.interfaces.errors import KernelError
from ds.interfaces.kernels import AdagradHyper, AdamHyper, LionHyper, QuantizedTensor
from ds.sim.accelerator import active_device

_CHUNK = 1 << 20  # elements per slice of a real-tensor update: at most 4 MiB of temporaries


def _fake(*tensors: torch.Tensor | None) -> bool:
    """Whether every tensor is fake. Fake ones are updated in place with the same reads and
    writes and no temporaries, and in one op each: slicing a 70B-parameter state into 1M-element
    pieces made each simulated step take minutes."""
    from torch._subclasses.fake_tensor import is_fake

    return all(t is None or is_fake(t) for t in tensors)


def _slices(*tensors: torch.Tensor | None) -> Any:
    """Matching 1-D slices of ``tensors`` (None stays None), ``_CHUNK`` elements at a time."""
    flat = [t.view(-1) if t is not None else None for t in tensors]
    n = flat[0].numel() if flat[0] is not None else 0
    for start in range(0, n, _CHUNK):
        yield [f[start : start + _CHUNK] if f is not None else None for f in flat]


class SimAsyncIO:
    """``AsyncIOHandle`` that moves no bytes: it checks buffers and counts them per file."""

    def __init__(self) -> None:
        self.written: dict[str, int] = defaultdict(int)
        self.read: dict[str, int] = defaultdict(int)
        self._pending = 0

    def _host(self, op: str, buffer: torch.Tensor) -> int:
        if buffer.device.type != "cpu":
            raise KernelError(
                f"aio {op} got a buffer on {buffer.device}; file I/O reads and writes host "
                "memory: copy device tensors to a (pinned) host buffer first"
            )
        return int(buffer.numel() * buffer.element_size())

    def sync_pwrite(self, buffer: torch.Tensor, path: str, offset: int = 0) -> int:
        n = self._host("write", buffer)
        self.written[path] += n
        return n

    def sync_pread(self, buffer: torch.Tensor, path: str, offset: int = 0) -> int:
        n = self._host("read", buffer)
        self.read[path] += n
        dev = active_device()
        if dev is not None:
            dev.touch(buffer)  # the read fills the buffer's pages
        return n

    def async_pwrite(self, buffer: torch.Tensor, path: str, offset: int = 0) -> None:
        self.sync_pwrite(buffer, path, offset)
        self._pending += 1

    def async_pread(self, buffer: torch.Tensor, path: str, offset: int = 0) -> None:
        self.sync_pread(buffer, path, offset)
        self._pending += 1

    def wait(self) -> int:
        done, self._pending = self._pending, 0
        return done

    def new_pinned_buffer(self, num_bytes: int) -> torch.Tensor:
        return torch.empty(num_bytes, dtype=torch.uint8)

    def free_pinned_buffer(self, buffer: torch.Tensor) -> None:
        return None

    def close(self) -> None:
        return None


class SimKernels:
    """``KernelProvider`` on fake tensors for one device kind (``"cpu"`` or ``"cuda"``; None:
    any device, no placement rule)."""

    def __init__(self, kind: str | None = None) -> None:
        self.kind = kind
        self.handles: list[SimAsyncIO] = []

    def name(self) -> str:
        return f"sim-{self.kind or 'any'}"

    def devices(self) -> Sequence[str]:
        return [self.kind] if self.kind else ["cpu", "cuda"]

    def info(self) -> dict[str, str]:
        return {"simd": "simulated", "threads": "1"}

    def _check(self, op: str, *tensors: torch.Tensor | None) -> None:
        if self.kind is None:
            return
        for t in tensors:
            if t is not None and t.device.type != self.kind:
                raise KernelError(
                    f"the {self.kind} kernel provider's {op} got a tensor on {t.device}: "
                    f"{self.kind} kernels step {self.kind} tensors; keep the master, its "
                    "gradient and its state on one device"
                )

    def adam_step(
        self,
        step: int,
        hyper: AdamHyper,
        params: torch.Tensor,
        grads: torch.Tensor,
        exp_avg: torch.Tensor,
        exp_avg_sq: torch.Tensor,
        low_precision_out: torch.Tensor | None = None,
    ) -> None:
        self._check("adam_step", params, grads, exp_avg, exp_avg_sq)
        if _fake(params, grads, exp_avg, exp_avg_sq, low_precision_out):
            exp_avg.mul_(hyper.beta1).add_(grads, alpha=1 - hyper.beta1)
            exp_avg_sq.mul_(hyper.beta2).addcmul_(grads, grads, value=1 - hyper.beta2)
            params.addcdiv_(exp_avg, exp_avg_sq, value=-hyper.lr)  # reads both, as sqrt + eps do
            if low_precision_out is not None:
                low_precision_out.copy_(params)
            return
        for p, g, m, v, out in _slices(params, grads, exp_avg, exp_avg_sq, low_precision_out):
            m.mul_(hyper.beta1).add_(g, alpha=1 - hyper.beta1)
            v.mul_(hyper.beta2).addcmul_(g, g, value=1 - hyper.beta2)
            p.addcdiv_(m, v.sqrt().add_(hyper.eps), value=-hyper.lr)
            if out is not None:
                out.copy_(p)

    def adagrad_step(
        self,
        step: int,
        hyper: AdagradHyper,
        params: torch.Tensor,
        grads: torch.Tensor,
        state_sum: torch.Tensor,
        low_precision_out: torch.Tensor | None = None,
    ) -> None:
        self._check("adagrad_step", params, grads, state_sum)
        if _fake(params, grads, state_sum, low_precision_out):
            state_sum.addcmul_(grads, grads)
            params.addcdiv_(grads, state_sum, value=-hyper.lr)
            if low_precision_out is not None:
                low_precision_out.copy_(params)
            return
        for p, g, s, out in _slices(params, grads, state_sum, low_precision_out):
            s.addcmul_(g, g)
            p.addcdiv_(g, s.sqrt().add_(hyper.eps), value=-hyper.lr)
            if out is not None:
                out.copy_(p)

    def lion_step(
        self,
        step: int,
        hyper: LionHyper,
        params: torch.Tensor,
        grads: torch.Tensor,
        exp_avg: torch.Tensor,
        low_precision_out: torch.Tensor | None = None,
    ) -> None:
        self._check("lion_step", params, grads, exp_avg)
        if _fake(params, grads, exp_avg, low_precision_out):
            params.add_(exp_avg, alpha=-hyper.lr)  # reads the interpolated sign's inputs
            exp_avg.lerp_(grads, 1 - hyper.beta2)
            if low_precision_out is not None:
                low_precision_out.copy_(params)
            return
        for p, g, m, out in _slices(params, grads, exp_avg, low_precision_out):
            p.add_(m.lerp(g, 1 - hyper.beta1).sign_(), alpha=-hyper.lr)
            m.lerp_(g, 1 - hyper.beta2)
            if out is not None:
                out.copy_(p)

    def new_state(self, like: torch.Tensor, avoid: Sequence[torch.Tensor] = ()) -> torch.Tensor:
        self._check("new_state", like)
        return torch.zeros_like(like, memory_format=torch.contiguous_format)

    def quantize(self, x: torch.Tensor, scheme: str, group_size: int) -> QuantizedTensor:
        self._check("quantize", x)
        groups = -(-x.numel() // group_size)
        return QuantizedTensor(
            torch.empty(x.numel(), dtype=torch.int8, device=x.device),
            torch.empty(groups, dtype=torch.float32, device=x.device),
            None,
            tuple(x.shape),
            group_size,
            scheme,
        )

    def dequantize(self, q: QuantizedTensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        return torch.empty(q.shape, dtype=dtype or torch.float32, device=q.data.device)

    def quantized_linear(
        self,
        x: torch.Tensor,
        q: QuantizedTensor,
        bias: torch.Tensor | None = None,
        *,
        activations: str = "float",  # shapes only: the simulated result is the same either way
    ) -> torch.Tensor:
        return torch.nn.functional.linear(x, self.dequantize(q, x.dtype), bias)

    def aio_handle(self, *args: Any, **kwargs: Any) -> SimAsyncIO:
        handle = SimAsyncIO()
        self.handles.append(handle)
        return handle


__all__ = ["SimAsyncIO", "SimKernels"]
