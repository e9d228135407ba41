"""``ds autotune``: pick the ZeRO stage, micro-batch, offload and bucket size that train fastest.

The search keeps the global batch fixed (``train_batch_size`` of the base config, or its micro
batch x accumulation x world): each micro-batch size gets the accumulation that restores it, and a
size that does not divide it is skipped. With a model config (``--model``), every point is first
estimated with ``ds estimate`` (the engine on the simulated GPU world) and points above the
memory limit are pruned without running. The rest are timed in short real trials: the user's
script, unchanged, started with ``ds run`` and the point's config in place of the base config's
path in its arguments; the engine times steps ``start+1 .. end`` and ends the trial there. The
winner is the highest measured samples/s.

How a trial starts the script and tells the engine to time it is the composition root's to say
(ds-autotune declares neither the launcher nor the engine): it hands a :class:`TrialHarness` to
:func:`run_trial` when it wires the ``ds autotune`` command.
"""

from __future__ import annotations

import copy
import json
import os
import statistics
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ds.interfaces.errors import ConfigError


@dataclass(frozen=True)
class TrialHarness:
    """How a trial runs the user's script: given by whoever wires ``ds autotune``.

    ``launch``: the command that starts the script on ``--nproc N`` ranks (``ds run``).
    ``environment(result, start, end)``: the variables that make the engine time optimizer steps
    ``start+1 .. end``, write ``<result>.rank<r>`` (JSON: ``step_times_s``, ``samples_per_step``,
    ``peak_host_rss_bytes``) on every rank after step ``end`` and end the script there.
    """

    launch: Sequence[str]
    environment: Callable[[str, int, int], Mapping[str, str]]


@dataclass
class Point:
    stage: int
    micro_batch: int
    gradient_accumulation_steps: int
    offload: str
    reduce_bucket_size: int | None = None
    status: str = "pending"  # pruned | timed | failed
    why: str = ""
    estimate_bytes: int | None = None
    samples_per_s: float | None = None
    step_time_s: float | None = None
    peak_rss_bytes: int | None = None
    trial_s: float | None = None
    config: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def label(self) -> str:
        b = "" if self.reduce_bucket_size is None else f" bucket={self.reduce_bucket_size:.0e}"
        return (
            f"stage={self.stage} micro={self.micro_batch} gas={self.gradient_accumulation_steps}"
            f" offload={self.offload}{b}"
        )

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("config")
        return d


def global_batch(base: dict[str, Any], world: int) -> int:
    if isinstance(base.get("train_batch_size"), int):
        return int(base["train_batch_size"])
    micro = base.get("train_micro_batch_size_per_gpu")
    if not isinstance(micro, int):
        raise ConfigError(
            "the base config sets neither train_batch_size nor train_micro_batch_size_per_gpu; "
            "set one so that autotune knows the global batch to keep"
        )
    gas = base.get("gradient_accumulation_steps", 1)
    return int(micro) * int(gas if isinstance(gas, int) else 1) * world


def points(
    base: dict[str, Any],
    world: int,
    stages: Sequence[int],
    micro_batches: Sequence[int],
    offloads: Sequence[str],
    buckets: Sequence[int | None] = (None,),
) -> tuple[list[Point], list[str]]:
    """The search space, and a line for each combination skipped as impossible."""
    batch = global_batch(base, world)
    out: list[Point] = []
    skipped: list[str] = []
    micros = []
    for micro in micro_batches:
        if micro < 1 or batch % (micro * world):
            skipped.append(
                f"micro={micro}: {micro} x world {world} does not divide the global batch {batch}"
            )
        else:
            micros.append(micro)
    for stage in stages:
        if stage not in (0, 1, 2, 3):
            raise ConfigError(f"ZeRO stage {stage}: choose from 0, 1, 2, 3")
        for micro in micros:
            gas = batch // (micro * world)
            for offload in offloads:
                if offload not in ("none", "cpu"):
                    raise ConfigError(f"offload {offload!r}: choose from none, cpu")
                if offload != "none" and stage == 0:
                    continue  # optimizer offload needs ZeRO stage >= 1
                for bucket in buckets:
                    p = Point(stage, micro, gas, offload, bucket)
                    p.config = trial_config(base, p)
                    out.append(p)
    return out, skipped


def trial_config(base: dict[str, Any], p: Point) -> dict[str, Any]:
    cfg = copy.deepcopy(base)
    cfg.pop("train_batch_size", None)
    cfg["train_micro_batch_size_per_gpu"] = p.micro_batch
    cfg["gradient_accumulation_steps"] = p.gradient_accumulation_steps
    zero = dict(cfg.get("zero_optimization") or {})
    zero["stage"] = p.stage
    zero.pop("offload_optimizer", None)
    if p.offload == "cpu":
        zero["offload_optimizer"] = {"device": "cpu"}
    if p.stage < 3:
        zero.pop("offload_param", None)
    if p.reduce_bucket_size is not None:
        zero["reduce_bucket_size"] = p.reduce_bucket_size
        zero["allgather_bucket_size"] = p.reduce_bucket_size
    cfg["zero_optimization"] = zero
    cfg.pop("autotuning", None)
    return cfg


def prune(pts: Sequence[Point], estimate_bytes: Callable[[Point], int], limit: int | None) -> None:
    for p in pts:
        p.estimate_bytes = int(estimate_bytes(p))
        if limit is not None and p.estimate_bytes > limit:
            p.status = "pruned"
            p.why = f"estimated {_size(p.estimate_bytes)} per rank > limit {_size(limit)}"


def run_trial(
    p: Point,
    *,
    script: Sequence[str],
    base_config_path: str,
    nproc: int,
    workdir: str,
    index: int,
    start: int,
    end: int,
    timeout_s: float,
    harness: TrialHarness,
) -> None:
    """Time one point: ``<harness.launch> --nproc N script...`` with the point's config."""
    os.makedirs(workdir, exist_ok=True)
    cfg_path = os.path.join(workdir, f"trial{index:02d}.json")
    with open(cfg_path, "w", encoding="utf-8") as f:
        json.dump(p.config, f, indent=1)
    args = [cfg_path if a == base_config_path else a for a in script]
    if cfg_path not in args:
        raise ConfigError(
            f"the script's arguments do not contain the base config's path {base_config_path!r}; "
            "pass the same path to --config and to the script (e.g. --config ds.json ... "
            "train.py --deepspeed_config ds.json)"
        )
    result = os.path.join(workdir, f"trial{index:02d}.result")
    cmd = [*harness.launch, "--nproc", str(nproc)]
    env = {**os.environ, **harness.environment(result, start, end)}
    began = time.perf_counter()
    try:
        proc = subprocess.run(
            [*cmd, *args], env=env, capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        p.status, p.why = "failed", f"no result within {timeout_s:.0f} s (--trial-timeout)"
        return
    finally:
        p.trial_s = time.perf_counter() - began
    ranks = []
    for r in range(nproc):
        try:
            with open(f"{result}.rank{r}", encoding="utf-8") as f:
                ranks.append(json.load(f))
        except OSError:
            break
    if proc.returncode != 0 or len(ranks) != nproc:
        tail = [ln for ln in (proc.stderr or proc.stdout or "").splitlines() if ln.strip()]
        last = tail[-1][:200] if tail else "no output"
        p.status = "failed"
        p.why = f"exit status {proc.returncode}: {last}"
        if proc.returncode == 0:
            p.why = f"the script ended before step {end} (give it more steps): {last}"
        return
    times = ranks[0]["step_times_s"]
    if not times:
        p.status, p.why = "failed", f"no step was timed between steps {start} and {end}"
        return
    p.step_time_s = statistics.median(times)
    p.samples_per_s = ranks[0]["samples_per_step"] / p.step_time_s
    p.peak_rss_bytes = max(int(r["peak_host_rss_bytes"]) for r in ranks)
    p.status = "timed"


def rank_points(pts: list[Point]) -> list[Point]:
    timed = sorted((p for p in pts if p.status == "timed"), key=lambda p: -(p.samples_per_s or 0.0))
    if timed:
        best = timed[0]
        best.why = "best measured samples/s"
        for p in timed[1:]:
            assert p.samples_per_s is not None and best.samples_per_s is not None
            p.why = f"slower: {p.samples_per_s / best.samples_per_s:.2f}x the best's samples/s"
    rest = [p for p in pts if p.status != "timed"]
    return timed + rest


def format_table(pts: Sequence[Point]) -> str:
    head = f"{'#':>2}  {'point':<44} {'samples/s':>10} {'step s':>8} {'peak RSS':>9}  why"
    lines = [head, "-" * len(head)]
    for i, p in enumerate(pts, 1):
        sps = f"{p.samples_per_s:.2f}" if p.samples_per_s else "-"
        st = f"{p.step_time_s:.3f}" if p.step_time_s else "-"
        rss = _size(p.peak_rss_bytes) if p.peak_rss_bytes else "-"
        lines.append(f"{i:>2}  {p.label:<44} {sps:>10} {st:>8} {rss:>9}  {p.status}: {p.why}")
    return "\n".join(lines)


def _size(n: int | None) -> str:
    """Bytes in the largest binary unit that keeps the number >= 1 (``0.43GiB``, ``12.0KiB``)."""
    if n is None:
        return "-"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return f"{n}B"


__all__ = [
    "Point",
    "TrialHarness",
    "format_table",
    "points",
    "prune",
    "rank_points",
    "run_trial",
    "trial_config",
]
