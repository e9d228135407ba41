"""``deepspeed.runtime.pipe.schedule``: DeepSpeed's pipeline instruction classes and clocked
schedules (inference, 1F1B training, data parallel) that emit them.

A schedule's ``steps()`` yields one list of instructions per clock step; ``ds.initialize`` runs
ds's pipeline engine (:mod:`ds.parallel.pipeline`), which executes its own schedules, so these are
for code that builds, inspects or prints a schedule (buffers: ``micro_batch_id %
num_pipe_buffers()``)."""

from __future__ import annotations

from collections.abc import Iterator
from operator import attrgetter
from typing import Any


class PipeInstruction:
    """One instruction; keyword arguments become attributes (``buffer_id``, ...)."""

    def __init__(self, **kwargs: Any) -> None:
        self.name = type(self).__name__
        self.kwargs = kwargs
        for key, value in kwargs.items():
            setattr(self, key, value)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())
        return f"{self.name}({args})"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.kwargs == other.kwargs  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((self.name, tuple(sorted(self.kwargs.items()))))


class OptimizerStep(PipeInstruction):
    pass


class ReduceGrads(PipeInstruction):
    pass


class ReduceTiedGrads(PipeInstruction):
    pass


class BufferOpInstruction(PipeInstruction):
    def __init__(self, buffer_id: int, **kwargs: Any) -> None:
        super().__init__(buffer_id=buffer_id, **kwargs)


class LoadMicroBatch(BufferOpInstruction):
    pass


class ForwardPass(BufferOpInstruction):
    pass


class BackwardPass(BufferOpInstruction):
    pass


class SendActivation(BufferOpInstruction):
    pass


class RecvActivation(BufferOpInstruction):
    pass


class SendGrad(BufferOpInstruction):
    pass


class RecvGrad(BufferOpInstruction):
    pass


class PipeSchedule:
    """``steps()`` yields one instruction list per clock step (empty when the stage idles); a
    step's sends carry the previous step's results, so every send meets its receive on the
    neighbouring stage in the same step."""

    def __init__(self, micro_batches: int, stages: int, stage_id: int) -> None:
        if micro_batches < 1 or stages < 1 or not 0 <= stage_id < stages:
            raise ValueError(
                f"{type(self).__name__}(micro_batches={micro_batches}, stages={stages}, "
                f"stage_id={stage_id}): need micro_batches >= 1 and 0 <= stage_id < stages"
            )
        self.micro_batches, self.stages, self.stage_id = micro_batches, stages, stage_id
        self.prev_stage, self.next_stage = stage_id - 1, stage_id + 1

    def steps(self) -> Iterator[list[PipeInstruction]]:
        raise NotImplementedError

    def num_pipe_buffers(self) -> int:
        return self.micro_batches

    # DeepSpeed's read-only names for the constructor's arguments.
    stage = property(attrgetter("stage_id"))
    num_stages = property(attrgetter("stages"))
    num_micro_batches = property(attrgetter("micro_batches"))

    @property
    def is_first_stage(self) -> bool:
        return self.stage_id == 0

    @property
    def is_last_stage(self) -> bool:
        return self.stage_id == self.stages - 1

    def _valid_micro_batch(self, micro_batch_id: int) -> bool:
        return 0 <= micro_batch_id < self.micro_batches

    def _valid_stage(self, stage_id: int) -> bool:
        return 0 <= stage_id < self.stages

    def _buffer_idx(self, micro_batch_id: int) -> int:
        return micro_batch_id % self.num_pipe_buffers()

    def _exchange(
        self, sends: list[PipeInstruction], recvs: list[PipeInstruction]
    ) -> list[PipeInstruction]:
        # Even stages send first and odd stages receive first, so neighbours pair up.
        return sends + recvs if self.stage_id % 2 == 0 else recvs + sends

    def __iter__(self) -> Iterator[list[PipeInstruction]]:
        return self.steps()


class InferenceSchedule(PipeSchedule):
    """Forward passes only: micro-batch ``t - stage`` at step ``t``, two buffers alternating."""

    def num_pipe_buffers(self) -> int:
        return 2

    def steps(self) -> Iterator[list[PipeInstruction]]:
        for t in range(self.micro_batches + self.stages - 1):
            mb = t - self.stage_id
            valid, sent = self._valid_micro_batch(mb), self._valid_micro_batch(mb - 1)
            cmds: list[PipeInstruction] = []
            if valid and (self.is_first_stage or self.is_last_stage):
                cmds.append(LoadMicroBatch(self._buffer_idx(mb)))
            sends = (
                [SendActivation(self._buffer_idx(mb - 1))]
                if sent and not self.is_last_stage
                else []
            )
            recvs = (
                [RecvActivation(self._buffer_idx(mb))] if valid and not self.is_first_stage else []
            )
            cmds += self._exchange(sends, recvs)
            if valid:
                cmds.append(ForwardPass(self._buffer_idx(mb)))
            yield cmds


class TrainSchedule(PipeSchedule):
    """1F1B on a clock of ``2 * (micro_batches + stages - 1)`` steps: stage ``s`` runs the
    forward of micro-batch ``i`` at step ``2i + s`` and its backward at ``2i + 2S - 1 - s``
    (opposite parities, so one stage never has both in a step); the last step reduces tied and
    data-parallel gradients and steps the optimizer."""

    def num_pipe_buffers(self) -> int:
        return max(2, min(self.stages - self.stage_id, self.micro_batches))

    def _forward_id(self, t: int) -> int:
        return (t - self.stage_id) // 2 if (t - self.stage_id) % 2 == 0 else -1

    def _backward_id(self, t: int) -> int:
        k = t - 2 * self.stages + 1 + self.stage_id
        return k // 2 if k % 2 == 0 else -1

    def steps(self) -> Iterator[list[PipeInstruction]]:
        total = 2 * (self.micro_batches + self.stages - 1)
        for t in range(total):
            forward = (t - self.stage_id) % 2 == 0
            mb = self._forward_id(t) if forward else self._backward_id(t)
            prev = self._backward_id(t - 1) if forward else self._forward_id(t - 1)
            valid, prev_valid = self._valid_micro_batch(mb), self._valid_micro_batch(prev)
            cmds: list[PipeInstruction] = []
            if forward:
                sends = (
                    [SendGrad(self._buffer_idx(prev))]
                    if prev_valid and not self.is_first_stage
                    else []
                )
                recvs = (
                    [RecvActivation(self._buffer_idx(mb))]
                    if valid and not self.is_first_stage
                    else []
                )
                cmds += self._exchange(sends, recvs)
                if valid:
                    if self.is_first_stage or self.is_last_stage:
                        cmds.append(LoadMicroBatch(self._buffer_idx(mb)))
                    cmds.append(ForwardPass(self._buffer_idx(mb)))
            else:
                sends = (
                    [SendActivation(self._buffer_idx(prev))]
                    if prev_valid and not self.is_last_stage
                    else []
                )
                recvs = [RecvGrad(self._buffer_idx(mb))] if valid and not self.is_last_stage else []
                cmds += self._exchange(sends, recvs)
                if valid:
                    cmds.append(BackwardPass(self._buffer_idx(mb)))
            if t == total - 1:
                cmds += [ReduceTiedGrads(), ReduceGrads(), OptimizerStep()]
            yield cmds


class DataParallelSchedule(PipeSchedule):
    """One stage: forward and backward per micro-batch, then reduce and step."""

    def num_pipe_buffers(self) -> int:
        return 1

    def steps(self) -> Iterator[list[PipeInstruction]]:
        for m in range(self.micro_batches):
            cmds: list[PipeInstruction] = [LoadMicroBatch(0), ForwardPass(0), BackwardPass(0)]
            if m == self.micro_batches - 1:
                cmds += [ReduceGrads(), OptimizerStep()]
            yield cmds


__all__ = [
    "BackwardPass", "BufferOpInstruction", "DataParallelSchedule", "ForwardPass",
    "InferenceSchedule", "LoadMicroBatch", "OptimizerStep", "PipeInstruction", "PipeSchedule",
    "RecvActivation", "RecvGrad", "ReduceGrads", "ReduceTiedGrads", "SendActivation", "SendGrad",
    "TrainSchedule",
]  # fmt: skip
