"""Executing one stage's instruction list: forwards, backwards and the p2p exchange between them.

The runner owns nothing but the step's in-flight tensors; the engine hands it the micro-batches,
the loss scale and the backward call (so the ZeRO strategy sees every backward).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ds.parallel.pipeline.module import PipelineModule
from ds.parallel.pipeline.p2p import P2P, as_tuple, tag_of
from ds.parallel.pipeline.schedule import Action

Backward = Callable[[Sequence[torch.Tensor], Sequence[torch.Tensor | None]], None]


def _autograd_backward(
    tensors: Sequence[torch.Tensor], grads: Sequence[torch.Tensor | None]
) -> None:
    torch.autograd.backward(list(tensors), grad_tensors=list(grads))


@dataclass
class StepTimes:
    """Host seconds of one step on this stage."""

    forward_s: float = 0.0
    backward_s: float = 0.0
    wait_s: float = 0.0  # blocked in receives: this stage's share of the bubble
    total_s: float = 0.0
    losses: list[torch.Tensor] = field(default_factory=list)

    @property
    def compute_s(self) -> float:
        return self.forward_s + self.backward_s


def _to(x: Any, device: torch.device) -> Any:
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, (tuple, list)):
        return type(x)(_to(t, device) for t in x)
    return x


def _requiring_grad(x: Any) -> Any:
    """``x`` with its floating-point tensors requiring grad (new tensor objects: the caller's
    batch is left as it was)."""
    if isinstance(x, torch.Tensor):
        return x.detach().requires_grad_(x.is_floating_point())
    if isinstance(x, (tuple, list)):
        return type(x)(_requiring_grad(t) for t in x)
    return x


class PipelineRunner:
    """Runs a schedule on the stage that ``module`` holds.

    ``pp_ranks``: the global ranks of this rank's pipeline group, in stage order (stage ``s``'s
    peer for part ``k`` is ``pp_ranks[k % stages]``)."""

    def __init__(
        self,
        module: PipelineModule,
        comm: Any,
        pp_ranks: Sequence[int],
        device: torch.device,
        accelerator: Any = None,
    ) -> None:
        assert module.num_stages is not None and module.stage_id is not None
        self.module = module
        self.stages = module.num_stages
        self.chunks = module.num_virtual_stages
        self.stage = module.stage_id
        self.pp_ranks = list(pp_ranks)
        self.device = device
        self.p2p = P2P(comm, device) if self.stages > 1 else None
        # On a device that runs kernels asynchronously the host clock measures launches, not
        # compute: there forward/backward/step times come from timing events, read once at the
        # end of the step (the engine's bubble all-gather waits for the step there anyway).
        caps = accelerator.capabilities() if accelerator is not None else None
        async_events = caps is not None and caps.has_events and not caps.is_synchronized_device
        self._events = accelerator if async_events else None

    @property
    def uses_device_events(self) -> bool:
        return self._events is not None

    def _mark(self) -> Any:
        assert self._events is not None
        event = self._events.new_event(enable_timing=True)
        event.record()
        return event

    def _part(self, chunk: int) -> int:
        return chunk * self.stages + self.stage

    def _peer(self, part: int) -> int:
        return self.pp_ranks[part % self.stages]

    def run(
        self,
        actions: Sequence[Action],
        microbatches: Sequence[tuple[Any, Any]],
        *,
        loss_scale: float = 1.0,
        backward: Backward = _autograd_backward,
    ) -> StepTimes:
        """``microbatches[m] = (inputs, labels)``; the first part reads the inputs, the last the
        labels. On the last part each micro-batch's loss (detached) is in ``losses``; its
        backward starts from ``loss * loss_scale``."""
        times = StepTimes()
        last = self.stages * self.chunks - 1
        saved: dict[tuple[int, int], tuple[Any, Any]] = {}  # (mb, chunk) -> (input, output)
        losses: dict[int, torch.Tensor] = {}
        start = time.perf_counter()
        ev = self._events is not None
        spans: list[tuple[str, Any, Any]] = []  # (kind, start event, end event)
        first = self._mark() if ev else None
        for i, a in enumerate(actions):
            part = self._part(a.chunk)
            key = (a.microbatch, a.chunk)
            if self.p2p is not None:
                # This action's sends wait for the next action's receive only when that is the
                # very next thing this stage does (see ds.parallel.pipeline.p2p).
                nxt = actions[i + 1] if i + 1 < len(actions) else None
                self.p2p.defer = nxt is not None and self._receives_first(nxt, last)
            if a.kind == "F":
                if part == 0:
                    x = _to(microbatches[a.microbatch][0], self.device)
                    if torch.is_grad_enabled() and self.module.checkpoint_needs_input_grad():
                        x = _requiring_grad(x)
                else:
                    assert self.p2p is not None
                    t0 = time.perf_counter()
                    x = self.p2p.recv_activation(
                        self._peer(part - 1), tag_of(0, a.microbatch, a.chunk, self.chunks)
                    )
                    times.wait_s += time.perf_counter() - t0
                if self.p2p is not None:
                    self.p2p.flush()  # sends held for a receive that did not come go now
                t0 = time.perf_counter()
                e0 = self._mark() if ev else None
                y = self.module.forward_chunk(a.chunk, x)
                if part == last:
                    labels = _to(microbatches[a.microbatch][1], self.device)
                    y = self._loss(y, labels)
                    losses[a.microbatch] = y.detach()
                times.forward_s += time.perf_counter() - t0
                if ev:
                    spans.append(("F", e0, self._mark()))
                if part < last:
                    assert self.p2p is not None
                    self.p2p.send_activation(
                        y,
                        self._peer(part + 1),
                        tag_of(0, a.microbatch, self._chunk_of(part + 1), self.chunks),
                    )
                if torch.is_grad_enabled():
                    saved[key] = (x, y)
                continue
            x, y = saved.pop(key)
            grads: list[torch.Tensor | None]
            if part == last:
                tensors, grads = [y * loss_scale if loss_scale != 1.0 else y], [None]
            else:
                assert self.p2p is not None
                t0 = time.perf_counter()
                grads = self.p2p.recv_grads(
                    y, self._peer(part + 1), tag_of(1, a.microbatch, a.chunk, self.chunks)
                )
                times.wait_s += time.perf_counter() - t0
                pairs = [(t, g) for t, g in zip(as_tuple(y), grads, strict=True) if g is not None]
                tensors, grads = [t for t, _ in pairs], [g for _, g in pairs]
            if self.p2p is not None:
                self.p2p.flush()  # sends held for a receive that did not come go now
            t0 = time.perf_counter()
            e0 = self._mark() if ev else None
            if tensors:
                backward(tensors, grads)
            times.backward_s += time.perf_counter() - t0
            if ev:
                spans.append(("B", e0, self._mark()))
            if part > 0:
                assert self.p2p is not None
                self.p2p.send_grads(
                    x,
                    self._peer(part - 1),
                    tag_of(1, a.microbatch, self._chunk_of(part - 1), self.chunks),
                )
        if self.p2p is not None:
            t0 = time.perf_counter()
            self.p2p.drain()
            times.wait_s += time.perf_counter() - t0
        times.total_s = time.perf_counter() - start
        if ev:
            last_event = self._mark()
            last_event.synchronize()  # every event of the step is complete after this one
            times.forward_s = sum(b.elapsed_time(e) for k, b, e in spans if k == "F") / 1e3
            times.backward_s = sum(b.elapsed_time(e) for k, b, e in spans if k == "B") / 1e3
            times.total_s = first.elapsed_time(last_event) / 1e3
        times.losses = [losses[m] for m in sorted(losses)]
        return times

    def _receives_first(self, a: Action, last: int) -> bool:
        part = self._part(a.chunk)
        return part > 0 if a.kind == "F" else part < last

    def _chunk_of(self, part: int) -> int:
        return part // self.stages

    def _loss(self, output: Any, labels: Any) -> torch.Tensor:
        fn = self.module.loss_fn
        if fn is None:
            # a one-element output is the loss as it is (autograd starts from it as from a
            # scalar), which is what a model ending in Linear(hidden, 1) gives
            if not isinstance(output, torch.Tensor) or output.numel() != 1:
                raise ValueError(
                    "the last stage's output is not a scalar loss and the PipelineModule has no "
                    "loss_fn; pass PipelineModule(loss_fn=...) (called as loss_fn(output, labels))"
                )
            return output
        return fn(output, labels)


__all__ = ["PipelineRunner", "StepTimes"]
