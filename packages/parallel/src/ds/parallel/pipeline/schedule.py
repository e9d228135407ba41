"""Pipeline schedules as pure per-stage instruction lists, and a simulator that checks them.

An instruction is a forward or backward of one micro-batch on one of the stage's chunks
(``chunk`` is the virtual stage: model part ``chunk * stages + stage``). Sends and receives are
implied: a forward receives its input from the previous part and sends its output to the next;
a backward receives the output's gradient from the next part and sends the input's to the
previous. A runner that posts sends without waiting and blocks on receives executes a list
without deadlock exactly when :func:`simulate` finishes it.

Bubble fractions (idle share of ``stages x step time`` with equal per-part times):

* GPipe (all forwards, then all backwards) and 1F1B: ``(p - 1) / (m + p - 1)``; 1F1B keeps at
  most ``p - stage`` micro-batches' activations alive instead of ``m``.
* Interleaved 1F1B with ``v`` chunks per stage: ``(p - 1) / (v * m + p - 1)``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ds.interfaces.errors import ConfigError

SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")


@dataclass(frozen=True)
class Action:
    kind: str  # "F" or "B"
    microbatch: int
    chunk: int = 0

    def __repr__(self) -> str:
        return f"{self.kind}{self.microbatch}" + (f".{self.chunk}" if self.chunk else "")


def bubble_fraction(stages: int, microbatches: int, chunks: int = 1) -> float:
    """The idle share of a schedule's step: ``(p - 1) / (v * m + p - 1)``."""
    return (stages - 1) / (chunks * microbatches + stages - 1)


def check_microbatches(schedule: str, stages: int, microbatches: int) -> None:
    """One-line errors for micro-batch counts a schedule cannot run."""
    if microbatches < 1:
        raise ConfigError(f"train_batch needs at least 1 micro-batch, got {microbatches}")
    if schedule in ("1f1b", "interleaved_1f1b") and microbatches < stages:
        raise ConfigError(
            f"{schedule} with {microbatches} micro-batches on {stages} stages: a 1F1B pipeline "
            f"needs at least as many micro-batches as stages; set gradient_accumulation_steps "
            f">= {stages} (or use schedule 'gpipe')"
        )
    if schedule == "interleaved_1f1b" and microbatches % stages:
        raise ConfigError(
            f"interleaved_1f1b with {microbatches} micro-batches on {stages} stages: the "
            f"micro-batch count must be a multiple of the stage count; set "
            f"gradient_accumulation_steps to a multiple of {stages}"
        )


def gpipe(stages: int, microbatches: int, stage: int) -> list[Action]:
    return [Action("F", m) for m in range(microbatches)] + [
        Action("B", m) for m in range(microbatches)
    ]


def one_f_one_b(stages: int, microbatches: int, stage: int) -> list[Action]:
    """Warm up with ``p - stage - 1`` forwards, then alternate forward/backward, then drain."""
    warmup = min(stages - stage - 1, microbatches)
    out = [Action("F", m) for m in range(warmup)]
    for i in range(microbatches - warmup):
        out += [Action("F", warmup + i), Action("B", i)]
    out += [Action("B", m) for m in range(microbatches - warmup, microbatches)]
    return out


def interleaved_one_f_one_b(
    stages: int, microbatches: int, stage: int, chunks: int
) -> list[Action]:
    """Megatron-LM's interleaved 1F1B: micro-batches go through the chunks in groups of ``p``
    (forward chunk 0..v-1, backward v-1..0), with a longer warm-up so the later chunks fill."""
    p, v, total = stages, chunks, microbatches * chunks

    def order(k: int, backward: bool) -> tuple[int, int]:
        group, within = divmod(k, p * v)
        chunk = within // p
        if backward:
            chunk = v - 1 - chunk
        return group * p + within % p, chunk

    warmup = min((p - stage - 1) * 2 + (v - 1) * p, total)
    out = [Action("F", *order(k, False)) for k in range(warmup)]
    for i in range(total - warmup):
        out.append(Action("F", *order(warmup + i, False)))
        out.append(Action("B", *order(i, True)))
    out += [Action("B", *order(k, True)) for k in range(total - warmup, total)]
    return out


def build(name: str, stages: int, microbatches: int, stage: int, chunks: int = 1) -> list[Action]:
    """The instruction list of ``stage`` for schedule ``name``."""
    check_microbatches(name, stages, microbatches)
    if name == "gpipe":
        return gpipe(stages, microbatches, stage)
    if name == "1f1b":
        return one_f_one_b(stages, microbatches, stage)
    if name == "interleaved_1f1b":
        return interleaved_one_f_one_b(stages, microbatches, stage, chunks)
    raise ConfigError(f"pipeline.schedule={name!r} is not known; use one of {', '.join(SCHEDULES)}")


def forward_only(actions: list[Action]) -> list[Action]:
    """The forwards of a schedule in its order (evaluation): still deadlock-free, since forwards
    wait only on forwards."""
    return [a for a in actions if a.kind == "F"]


@dataclass(frozen=True)
class Simulation:
    makespan: float
    busy: tuple[float, ...]  # per stage
    peak_live: tuple[int, ...]  # per stage: most micro-batch activations held at once

    @property
    def bubble_fraction(self) -> float:
        return 1.0 - sum(self.busy) / (len(self.busy) * self.makespan)


def simulate(
    schedules: list[list[Action]], chunks: int = 1, t_forward: float = 1.0, t_backward: float = 2.0
) -> Simulation:
    """Run every stage's list in order with zero-latency, unbounded sends: each instruction starts
    when its stage is free and its inputs exist. Raises on a deadlock (no stage can move) and on
    lists that forward or backward a (micro-batch, chunk) other than exactly once, or backward
    before forward."""
    p = len(schedules)
    parts = p * chunks
    done: dict[tuple[str, int, int], float] = {}  # (kind, microbatch, part) -> finish time
    for s, actions in enumerate(schedules):
        seen = [(a.kind, a.microbatch, a.chunk) for a in actions]
        if len(set(seen)) != len(seen):
            raise AssertionError(f"stage {s} repeats an instruction: {actions}")
    pos = [0] * p
    free = [0.0] * p
    busy = [0.0] * p
    live = [0] * p
    peak = [0] * p
    # Per-part durations: a chunk is 1/chunks of the stage's layers.
    tf, tb = t_forward / chunks, t_backward / chunks
    while any(pos[s] < len(schedules[s]) for s in range(p)):
        moved = False
        for s in range(p):
            if pos[s] >= len(schedules[s]):
                continue
            a = schedules[s][pos[s]]
            part = a.chunk * p + s
            if a.kind == "F":
                deps = [("F", a.microbatch, part - 1)] if part > 0 else []
                cost = tf
            else:
                deps = [("F", a.microbatch, part)]
                if part < parts - 1:
                    deps.append(("B", a.microbatch, part + 1))
                cost = tb
            if not all(d in done for d in deps):
                continue
            start = max([free[s]] + [done[d] for d in deps])
            free[s] = start + cost
            busy[s] += cost
            done[(a.kind, a.microbatch, part)] = free[s]
            live[s] += 1 if a.kind == "F" else -1
            peak[s] = max(peak[s], live[s])
            pos[s] += 1
            moved = True
        if not moved:
            stuck = {s: schedules[s][pos[s]] for s in range(p) if pos[s] < len(schedules[s])}
            raise AssertionError(f"schedule deadlocks: stages wait at {stuck}")
    return Simulation(max(free), tuple(busy), tuple(peak))


__all__ = [
    "SCHEDULES",
    "Action",
    "Simulation",
    "bubble_fraction",
    "build",
    "check_microbatches",
    "forward_only",
    "gpipe",
    "interleaved_one_f_one_b",
    "one_f_one_b",
    "simulate",
]
