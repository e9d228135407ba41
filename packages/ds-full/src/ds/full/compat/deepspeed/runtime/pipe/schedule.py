"""``deepspeed.runtime.pipe.schedule``: DeepSpeed's pipeline instruction classes, and schedules
that emit them from ds's 1F1B (:mod:`ds.parallel.pipeline.schedule`).

A schedule's ``steps()`` yields one list of instructions per step; ``ds.initialize`` runs ds's
pipeline engine, which executes the same schedules itself, so these are for code that inspects
or prints a schedule (buffers: ``micro_batch_id % num_pipe_buffers()``)."""

from __future__ import annotations

from collections.abc import Iterator
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

    @property
    def is_first_stage(self) -> bool:
        return self.stage_id == 0

    @property
    def is_last_stage(self) -> bool:
        return self.stage_id == self.stages - 1

    def _valid_stage(self, stage_id: int) -> bool:
        return 0 <= stage_id < self.stages

    def _buffer(self, micro_batch_id: int) -> int:
        return micro_batch_id % self.num_pipe_buffers()

    def _forward(self, m: int) -> list[PipeInstruction]:
        buf = self._buffer(m)
        first: PipeInstruction = LoadMicroBatch(buf) if self.is_first_stage else RecvActivation(buf)
        cmds = [first, ForwardPass(buf)]
        if self.is_last_stage and not self.is_first_stage:
            cmds.insert(1, LoadMicroBatch(buf))  # the labels
        if not self.is_last_stage:
            cmds.append(SendActivation(buf))
        return cmds

    def _backward(self, m: int) -> list[PipeInstruction]:
        buf = self._buffer(m)
        cmds: list[PipeInstruction] = [] if self.is_last_stage else [RecvGrad(buf)]
        cmds.append(BackwardPass(buf))
        if not self.is_first_stage:
            cmds.append(SendGrad(buf))
        return cmds

    def __iter__(self) -> Iterator[list[PipeInstruction]]:
        return self.steps()


class InferenceSchedule(PipeSchedule):
    """Forward passes only, two buffers alternating."""

    def num_pipe_buffers(self) -> int:
        return 2

    def steps(self) -> Iterator[list[PipeInstruction]]:
        for m in range(self.micro_batches):
            yield self._forward(m)


class TrainSchedule(PipeSchedule):
    """1F1B: ``stages - stage_id`` warm-up forwards, then a backward after each forward; the
    last step reduces tied and data-parallel gradients and steps the optimizer."""

    def num_pipe_buffers(self) -> int:
        return max(2, min(self.stages - self.stage_id, self.micro_batches))

    def steps(self) -> Iterator[list[PipeInstruction]]:
        from ds.parallel.pipeline.schedule import build

        actions = build("1f1b" if self.micro_batches >= self.stages else "gpipe",
                        self.stages, self.micro_batches, self.stage_id)  # fmt: skip
        for i, action in enumerate(actions):
            cmds = (self._forward if action.kind == "F" else self._backward)(action.microbatch)
            if i == len(actions) - 1:
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
