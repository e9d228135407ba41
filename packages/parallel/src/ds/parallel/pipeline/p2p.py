"""Activations and gradients between neighbouring stages, through the Communicator's p2p calls.

A message is a tensor or a tuple of tensors. Activations go with a header (count, dtypes,
shapes, which carry gradients) so the receiver needs no shape inference; gradients go back
without one (the sender of the activation knows its shapes). Each message has its own tag, so a
receive matches only its message whatever order the peer sends in. Sends are posted without
waiting (``isend``); the handles are kept, with their tensors, until :meth:`P2P.drain`.

Why sends can be deferred: NCCL runs a pair's sends and receives in issue order on one stream,
and a send waits for its receive. In 1F1B's steady state stage ``s`` sends an activation and then
receives a gradient while stage ``s+1`` sends that gradient and then receives the activation:
both streams start with a send, which for large messages never completes. With
``defer=True`` a send waits for this stage's next receive and goes with it in one
``batch_isend_irecv`` (one NCCL group, whose operations progress together), as pipeline
schedules on NCCL do. The runner defers only when the next action starts with that receive, so
nothing waits on compute.
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
        self.defer = False  # set by the runner: hold sends for the next receive (see above)
        self._pending: list[tuple[Any, Any]] = []
        self._deferred: list[tuple[torch.Tensor, int, int]] = []

    def _send(self, t: torch.Tensor, dst: int, tag: int) -> None:
        t = t.detach().contiguous()
        if self.defer:
            self._deferred.append((t, dst, tag))
        else:
            self._pending.append((self.comm.isend(t, dst, tag=tag), t))

    def _recv(self, t: torch.Tensor, src: int, tag: int) -> None:
        if not self._deferred:
            self.comm.recv(t, src, tag=tag)
            return
        dist = torch.distributed
        sends, self._deferred = self._deferred, []
        ops = [dist.P2POp(dist.isend, x, dst, tag=tg) for x, dst, tg in sends]
        ops.append(dist.P2POp(dist.irecv, t, src, tag=tag))
        works = self.comm.batch_isend_irecv(ops)
        if len(works) == len(ops):  # one handle per operation (gloo): wait for the receive
            self._pending.extend(zip(works[:-1], [x for x, _, _ in sends], strict=True))
            works[-1].wait()
        else:  # one handle for the group (NCCL coalesced)
            for w in works:
                w.wait()

    def flush(self) -> None:
        """Post the deferred sends now (no receive follows them)."""
        sends, self._deferred = self._deferred, []
        for t, dst, tag in sends:
            self._pending.append((self.comm.isend(t, dst, tag=tag), t))

    def send_activation(self, x: Any, dst: int, tag: int) -> None:
        tensors = as_tuple(x)
        if len(tensors) * 9 + 1 > _HEADER:
            raise ValueError(f"a stage output of {len(tensors)} tensors; at most 7 are supported")
        meta = [0] * _HEADER
        meta[0] = len(tensors)
        for i, t in enumerate(tensors):
            if t.dim() > _MAX_DIMS:
                raise ValueError(f"a stage output of {t.dim()} dimensions; at most {_MAX_DIMS}")
            base = 1 + 9 * i
            meta[base] = _DTYPES.index(t.dtype)
            meta[base + 1] = int(t.requires_grad)
            meta[base + 2] = t.dim()
            meta[base + 3 : base + 3 + t.dim()] = [int(n) for n in t.shape]
        post = getattr(self.comm, "post_values", None)  # a simulated world's fake tensors
        if post is not None:
            post(meta, dst, tag)
        self._send(torch.tensor(meta, dtype=torch.int64).to(self.device), dst, tag)
        for t in tensors:
            self._send(t, dst, tag)

    def recv_activation(self, src: int, tag: int) -> Any:
        header = torch.zeros(_HEADER, dtype=torch.int64, device=self.device)
        self._recv(header, src, tag)
        h = header.cpu().tolist()
        take = getattr(self.comm, "take_values", None)
        if take is not None:  # a simulated world: the header's values, which fake tensors lack
            h = take(src, tag)
        out = []
        for i in range(int(h[0])):
            base = 1 + 9 * i
            shape = h[base + 3 : base + 3 + int(h[base + 2])]
            t = torch.empty(shape, dtype=_DTYPES[int(h[base])], device=self.device)
            self._recv(t, src, tag)
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
                self._recv(g, src, tag)
                grads.append(g)
            else:
                grads.append(None)
        return grads

    def drain(self) -> None:
        self.flush()
        pending, self._pending = self._pending, []
        for handle, _ in pending:
            handle.wait()


__all__ = ["P2P", "as_tuple", "tag_of"]
