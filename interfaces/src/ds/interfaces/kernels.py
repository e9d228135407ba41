"""Kernel-provider contract: fused optimizer steps on flat buffers, quantizers, async file I/O.

Implemented by ds-ops-kernels (registered under ``ds.kernels``). All tensors are CPU tensors for the
native provider; a provider states the devices it serves in :meth:`KernelProvider.devices`.
A provider registered under a device type's name (``cpu``, ``cuda``) serves that device type:
``ds.full`` hands it to the engine for models on such a device. The optimizer steps take the
buffers of one flat tensor each and run on those tensors' own device, whatever device is current.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

OptimizerName = Literal["adam", "adamw", "adagrad", "lion"]


@dataclass(frozen=True)
class AdamHyper:
    lr: float
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    adamw_mode: bool = True  # decoupled weight decay; False = L2 added to the gradient
    bias_correction: bool = True


@dataclass(frozen=True)
class AdagradHyper:
    lr: float
    eps: float = 1e-10
    weight_decay: float = 0.0


@dataclass(frozen=True)
class LionHyper:
    lr: float
    beta1: float = 0.9
    beta2: float = 0.99
    weight_decay: float = 0.0


@dataclass(frozen=True)
class QuantizedTensor:
    """Group-wise quantized data. ``zero_points`` is None for symmetric schemes."""

    data: torch.Tensor  # int8, packed uint8 (int4: two values per byte) or float8
    scales: torch.Tensor  # float32, one per group
    zero_points: torch.Tensor | None
    shape: tuple[int, ...]
    group_size: int
    scheme: str  # "int8_sym", "int8_asym", "int4_sym", "int4_asym", "fp8_e4m3", "fp8_e5m2"


@runtime_checkable
class KernelProvider(Protocol):
    def name(self) -> str: ...
    def devices(self) -> Sequence[str]: ...
    def info(self) -> dict[str, str]: ...  # SIMD level, build flags, threads

    def adam_step(
        self,
        step: int,
        hyper: AdamHyper,
        params: torch.Tensor,
        grads: torch.Tensor,
        exp_avg: torch.Tensor,
        exp_avg_sq: torch.Tensor,
        low_precision_out: torch.Tensor | None = None,
    ) -> None: ...
    def adagrad_step(
        self,
        step: int,
        hyper: AdagradHyper,
        params: torch.Tensor,
        grads: torch.Tensor,
        state_sum: torch.Tensor,
        low_precision_out: torch.Tensor | None = None,
    ) -> None: ...
    def lion_step(
        self,
        step: int,
        hyper: LionHyper,
        params: torch.Tensor,
        grads: torch.Tensor,
        exp_avg: torch.Tensor,
        low_precision_out: torch.Tensor | None = None,
    ) -> None: ...

    # A zeroed, contiguous tensor shaped and typed like ``like``, on its device, for optimizer
    # state that the steps above will walk in lockstep with the tensors in ``avoid``; the
    # provider may choose its address so the walk runs at full speed.
    def new_state(self, like: torch.Tensor, avoid: Sequence[torch.Tensor] = ()) -> torch.Tensor: ...

    def quantize(self, x: torch.Tensor, scheme: str, group_size: int) -> QuantizedTensor: ...
    def dequantize(self, q: QuantizedTensor, dtype: torch.dtype | None = None) -> torch.Tensor: ...

    # ``x @ dequantize(q, x.dtype).T + bias`` for a weight ``q`` of shape (out, in); a provider
    # may compute it from the codes without a dequantized copy (decode steps on a CPU).
    # ``activations="int8"``: ``x`` quantized to int8 per block of one weight group first
    # (symmetric int8/int4 weights; ds.ops.quant.activations defines the math).
    def quantized_linear(
        self,
        x: torch.Tensor,
        q: QuantizedTensor,
        bias: torch.Tensor | None = None,
        *,
        activations: str = "float",
    ) -> torch.Tensor: ...

    def aio_handle(
        self,
        block_size: int = 1 << 20,
        queue_depth: int = 8,
        intra_op_parallelism: int = 1,
        single_submit: bool = False,
        overlap_events: bool = True,
        use_o_direct: bool = True,
    ) -> AsyncIOHandle: ...


@runtime_checkable
class AsyncIOHandle(Protocol):
    """Block-wise parallel file reads/writes. Errors surface from the next :meth:`wait`."""

    def sync_pwrite(self, buffer: torch.Tensor, path: str, offset: int = 0) -> int: ...
    def sync_pread(self, buffer: torch.Tensor, path: str, offset: int = 0) -> int: ...
    def async_pwrite(self, buffer: torch.Tensor, path: str, offset: int = 0) -> None: ...
    def async_pread(self, buffer: torch.Tensor, path: str, offset: int = 0) -> None: ...
    def wait(self) -> int: ...  # number of completed ops; raises AsyncIOError on failure
    def new_pinned_buffer(self, num_bytes: int) -> torch.Tensor: ...
    def free_pinned_buffer(self, buffer: torch.Tensor) -> None: ...
    def close(self) -> None: ...


@runtime_checkable
class PagedAttentionKernels(Protocol):
    """An optional capability of a kernel provider (the ``cpu`` provider has it): attention of
    one query token per sequence against a blocked KV cache ``[kv_heads, num_blocks, block_size,
    head_dim]``, read in place through ``block_tables`` [S, max_blocks] for the first
    ``context_lens[s]`` positions of each sequence. Plain softmax attention only (no window,
    softcapping or bias). ``applies`` says whether the kernel takes these tensors (dtype,
    device, layout); ``q`` [S, heads, head_dim] -> the output of the same shape."""

    def paged_decode_applies(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> bool: ...

    def paged_decode_attention(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        scale: float,
    ) -> torch.Tensor: ...


@runtime_checkable
class HalfLinearKernels(Protocol):
    """An optional capability of a kernel provider (the ``cpu`` provider has it): ``x @
    weight.T + bias`` for an fp16 or fp32 ``weight`` [out, in] read in its stored form, fp32
    sums, the result in ``x``'s dtype (fp16 or fp32). ``half_linear_applies`` says whether the
    kernel takes ``x`` against ``weight`` and is the faster path there (dtype, device, layout, a
    few rows: a decode step); elsewhere the caller keeps its own matmul."""

    def half_linear_applies(self, x: torch.Tensor, weight: torch.Tensor) -> bool: ...

    def half_linear(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor: ...
