"""Offload the inputs of checkpointed segments to host memory while the forward runs on.

With non-reentrant activation checkpointing a segment keeps only its input for the backward,
but over a deep model those inputs (the hidden states entering each layer) add up on the device.
:class:`MarkedActivationOffload` is a ``saved_tensors_hooks`` context: the tensors it was told
about (:meth:`~MarkedActivationOffload.mark`) are copied to host buffers when autograd saves
them and copied back when the backward unpacks them; every other saved tensor passes through.

* Copies run on a side stream where the device has streams, so the forward does not wait for
  device-to-host traffic, and the backward's compute waits only for the tensor it needs.
* The newest ``keep_last_count`` marked tensors stay on the device: the backward starts with
  them, before a round trip through the host could finish.
* Host buffers are dense, pooled by (shape, dtype) and optionally pinned through ``pin``; the
  restored tensor gets the original strides back.
* Tensors already on the host, smaller than ``min_offload_bytes``, parameters and buffers, and
  overlapping views (a zero stride) are not offloaded (counted in ``stats.skipped``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.autograd.graph import saved_tensors_hooks

BufferKey = tuple[tuple[int, ...], torch.dtype, torch.layout, bool]


@dataclass
class OffloadStats:
    saved_tensors_seen: int = 0
    marked_tensors: int = 0
    offloaded_tensors: int = 0
    restored_tensors: int = 0
    skipped_marked_tensors: int = 0
    kept_last_tensors: int = 0
    offloaded_bytes: int = 0
    restored_bytes: int = 0


@dataclass(frozen=True)
class _Ref:
    """What autograd keeps in place of an offloaded tensor."""

    key: int


@dataclass
class _OnHost:
    host: torch.Tensor
    device: torch.device
    shape: torch.Size
    stride: tuple[int, ...]
    buffer_key: BufferKey


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class MarkedActivationOffload(saved_tensors_hooks):
    def __init__(
        self,
        use_pin_memory: bool = True,
        use_streams: bool = True,
        min_offload_bytes: int = 1024,
        keep_last_count: int = 1,
        max_cpu_buffer_pool_count: int = 64,
        pin: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        for name, value in (
            ("keep_last_count", keep_last_count),
            ("min_offload_bytes", min_offload_bytes),
            ("max_cpu_buffer_pool_count", max_cpu_buffer_pool_count),
        ):
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        self.use_pin_memory = use_pin_memory
        self.use_streams = use_streams
        self.min_offload_bytes = min_offload_bytes
        self.keep_last_count = keep_last_count
        self.max_pool = max_cpu_buffer_pool_count
        self._pin = pin if pin is not None else (lambda t: t.pin_memory())
        self.stats = OffloadStats()
        self._marks: dict[int, int] = {}  # id(tensor) -> pending marks
        self._kept: dict[int, torch.Tensor] = {}  # newest marked tensors, still on the device
        self._on_host: dict[int, _OnHost] = {}
        self._restored: dict[int, torch.Tensor] = {}  # for a second backward (retain_graph)
        self._pool: dict[BufferKey, list[torch.Tensor]] = {}
        self._pooled = 0
        # Host buffers whose copy back to the device may still be running: (event, key, buffer).
        self._in_flight: list[tuple[Any, BufferKey, torch.Tensor]] = []
        self._next = 0
        self._active = False
        self._side: dict[torch.device, Any] = {}
        super().__init__(self._pack, self._unpack)

    # -- marking -----------------------------------------------------------------------------
    def mark(self, tensor: torch.Tensor) -> None:
        """Offload ``tensor`` the next time autograd saves it (a checkpoint's input)."""
        self._marks[id(tensor)] = self._marks.get(id(tensor), 0) + 1
        self.stats.marked_tensors += 1

    def consume_mark(self, tensor: torch.Tensor) -> bool:
        """Take one pending mark of ``tensor``; False if it has none (ids are reused, so a
        caller drops marks that autograd did not use)."""
        n = self._marks.get(id(tensor), 0)
        if n <= 0:
            return False
        if n == 1:
            del self._marks[id(tensor)]
        else:
            self._marks[id(tensor)] = n - 1
        return True

    # -- host buffers ------------------------------------------------------------------------
    def buffer_key(self, t: torch.Tensor) -> BufferKey:
        # Host buffers are dense, so tensors differing only in strides share them.
        return (tuple(t.size()), t.dtype, t.layout, self.use_pin_memory)

    def host_buffer(self, t: torch.Tensor) -> tuple[torch.Tensor, BufferKey]:
        self._reap(wait=False)
        key = self.buffer_key(t)
        pool = self._pool.get(key)
        if pool:
            self._pooled -= 1
            return pool.pop(), key
        host = torch.empty(tuple(t.size()), dtype=t.dtype, layout=t.layout, device="cpu")
        return (self._pin(host) if self.use_pin_memory else host), key

    def _reap(self, wait: bool) -> None:
        pending, self._in_flight = self._in_flight, []
        for event, key, host in pending:
            if wait or event.query():
                event.synchronize()
                self._give_back(key, host)
            else:
                self._in_flight.append((event, key, host))

    def _give_back(self, key: BufferKey, host: torch.Tensor) -> None:
        if self._pooled < self.max_pool:
            self._pool.setdefault(key, []).append(host)
            self._pooled += 1

    # -- the hooks ---------------------------------------------------------------------------
    def _skip(self, t: torch.Tensor) -> bool:
        return (
            t.device.type in ("cpu", "meta")
            or _nbytes(t) < self.min_offload_bytes
            or isinstance(t, torch.nn.Parameter)
            or (t.numel() > 1 and 0 in t.stride())
        )

    def _pack(self, t: torch.Tensor) -> Any:
        self.stats.saved_tensors_seen += 1
        if not self.consume_mark(t):
            return t
        if self._skip(t):
            self.stats.skipped_marked_tensors += 1
            return t
        self._next += 1
        self._kept[self._next] = t
        while len(self._kept) > self.keep_last_count:
            oldest = next(iter(self._kept))
            self._offload(oldest, self._kept.pop(oldest))
        return _Ref(self._next)

    def _unpack(self, saved: Any) -> Any:
        if not isinstance(saved, _Ref):
            return saved
        if saved.key in self._restored:
            return self._restored[saved.key]
        if saved.key in self._kept:
            t = self._kept.pop(saved.key)
            self.stats.kept_last_tensors += 1
        else:
            t = self._restore(saved.key)
        self._restored[saved.key] = t
        return t

    # -- copies ------------------------------------------------------------------------------
    def _stream(self, device: torch.device) -> Any:
        if not self.use_streams or device.type != "cuda":
            return None
        if device not in self._side:
            self._side[device] = torch.cuda.Stream(device=device)
        return self._side[device]

    def _offload(self, key: int, t: torch.Tensor) -> None:
        host, bkey = self.host_buffer(t)
        side = self._stream(t.device)
        entry = _OnHost(host, t.device, t.size(), t.stride(), bkey)
        if side is None:
            host.copy_(t.detach())
        else:
            side.wait_stream(torch.cuda.current_stream(t.device))
            with torch.cuda.stream(side):
                host.copy_(t.detach(), non_blocking=True)
            # The device memory may be reused only once the side stream has read it.
            t.record_stream(side)
        self._on_host[key] = entry
        self.stats.offloaded_tensors += 1
        self.stats.offloaded_bytes += _nbytes(host)

    def _restore(self, key: int) -> torch.Tensor:
        entry = self._on_host.pop(key, None)
        if entry is None:
            raise RuntimeError(
                f"offloaded activation {key} is gone: the backward must run inside the same "
                "offload context as its forward"
            )
        out = torch.empty_strided(
            entry.shape, entry.stride, dtype=entry.host.dtype, device=entry.device
        )
        side = self._stream(entry.device)
        if side is None:
            out.copy_(entry.host)
            self._give_back(entry.buffer_key, entry.host)
        else:
            # Same stream as the copy out, so it follows it; compute waits for this copy only.
            with torch.cuda.stream(side):
                out.copy_(entry.host, non_blocking=True)
            compute = torch.cuda.current_stream(entry.device)
            compute.wait_stream(side)
            out.record_stream(compute)
            self._in_flight.append((side.record_event(), entry.buffer_key, entry.host))
        self.stats.restored_tensors += 1
        self.stats.restored_bytes += _nbytes(out)
        return out

    # -- context -----------------------------------------------------------------------------
    def _clear(self) -> None:
        for side in self._side.values():
            side.synchronize()
        self._reap(wait=True)
        for entry in self._on_host.values():
            self._give_back(entry.buffer_key, entry.host)
        self._on_host.clear()
        self._kept.clear()
        self._restored.clear()
        self._marks.clear()

    def __enter__(self) -> MarkedActivationOffload:
        if self._active:
            raise RuntimeError(
                "an activation offload context is not re-entrant; use another instance to nest"
            )
        self._clear()
        self.stats = OffloadStats()
        self._active = True
        super().__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            self._active = False
            self._clear()


__all__ = ["BufferKey", "MarkedActivationOffload", "OffloadStats"]
