"""Activations and gradients between neighbouring stages, through the Communicator's p2p calls.

A message is a tensor or a tuple of tensors. Activations go with a header (count, dtypes,
shapes, which carry gradients) so the receiver needs no shape inference; gradients go back
without one (the sender of the activation knows its shapes). Each message has its own tag, so a
receive matches only its message whatever order the peer sends in. Sends are posted without
waiting (``isend``); the handles are kept, with their tensors, until :meth:`P2P.drain`.
"""

from __future__ import annotations

from typing import Any

import torch

_DTYPES = [
    torch.float32, torch.float16, torch.bfloat16, torch.float64,
    torch.int64, torch.int32, torch.bool, torch.uint8, torch.int8,
]  # fmt: skip
_MAX_DIMS = 6
_HEADER = 64  # int64 slots: 1 + 9 per tensor, up to 7 tensors


def tag_of(kind: int, microbatch: int, chunk: int, chunks: int) -> int:
    """0: activation, 1: gradient."""
    return 1 + kind + 2 * (chunk + chunks * microbatch)


def as_tuple(x: Any) -> tuple[torch.Tensor, ...]:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


class P2P:
    def __init__(self, comm: Any, device: torch.device) -> None:
        self.comm = comm
        self.device = device
        self._pending: list[tuple[Any, Any]] = []

    def _send(self, t: torch.Tensor, dst: int, tag: int) -> None:
        t = t.detach().contiguous()
        self._pending.append((self.comm.isend(t, dst, tag=tag), t))

    def send_activation(self, x: Any, dst: int, tag: int) -> None:
        tensors = as_tuple(x)
        if len(tensors) * 9 + 1 > _HEADER:
            raise ValueError(f"a stage output of {len(tensors)} tensors; at most 7 are supported")
        header = torch.zeros(_HEADER, dtype=torch.int64)
        header[0] = len(tensors)
        for i, t in enumerate(tensors):
            if t.dim() > _MAX_DIMS:
                raise ValueError(f"a stage output of {t.dim()} dimensions; at most {_MAX_DIMS}")
            base = 1 + 9 * i
            header[base] = _DTYPES.index(t.dtype)
            header[base + 1] = int(t.requires_grad)
            header[base + 2] = t.dim()
            header[base + 3 : base + 3 + t.dim()] = torch.tensor(t.shape, dtype=torch.int64)
        self._send(header.to(self.device), dst, tag)
        for t in tensors:
            self._send(t, dst, tag)

    def recv_activation(self, src: int, tag: int) -> Any:
        header = torch.zeros(_HEADER, dtype=torch.int64, device=self.device)
        self.comm.recv(header, src, tag=tag)
        h = header.cpu().tolist()
        out = []
        for i in range(int(h[0])):
            base = 1 + 9 * i
            shape = h[base + 3 : base + 3 + int(h[base + 2])]
            t = torch.empty(shape, dtype=_DTYPES[int(h[base])], device=self.device)
            self.comm.recv(t, src, tag=tag)
            if h[base + 1]:
                t.requires_grad_(True)
            out.append(t)
        return out[0] if len(out) == 1 else tuple(out)

    def send_grads(self, inputs: Any, dst: int, tag: int) -> None:
        for t in as_tuple(inputs):
            if t.requires_grad:
                # An input the stage did not use has no gradient: zeros keep the peer in step.
                self._send(t.grad if t.grad is not None else torch.zeros_like(t), dst, tag)

    def recv_grads(self, outputs: Any, src: int, tag: int) -> list[torch.Tensor | None]:
        grads: list[torch.Tensor | None] = []
        for t in as_tuple(outputs):
            if t.requires_grad:
                g = torch.empty_like(t)
                self.comm.recv(g, src, tag=tag)
                grads.append(g)
            else:
                grads.append(None)
        return grads

    def drain(self) -> None:
        pending, self._pending = self._pending, []
        for handle, _ in pending:
            handle.wait()


__all__ = ["P2P", "as_tuple", "tag_of"]
