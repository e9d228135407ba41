"""``ds autotune``: time short trials of a training script over ZeRO stages, micro-batch sizes,
offload and bucket sizes; write the fastest config and a ranked table.

The composition root registers the verb and hands :func:`main` the engine that ``--model``
estimates measure and the harness that runs each trial (:class:`ds.autotune.tune.TrialHarness`)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ds.interfaces.errors import DsError

if TYPE_CHECKING:
    from ds.autotune.tune import TrialHarness


def _ints(text: str) -> list[int]:
    try:
        return [int(float(x)) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers") from None


def _bytes(text: str) -> int:
    units = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    try:
        if t and t[-1] in units:
            return int(float(t[:-1]) * units[t[-1]])
        return int(float(t))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a size such as 20GiB") from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ds autotune",
        usage="ds autotune --config BASE.json [options] SCRIPT.py [script args with BASE.json]",
        description="Time short trials of SCRIPT over ZeRO stages, micro-batch sizes (the global "
        "batch kept by gradient accumulation), offload and bucket sizes; prune with ds estimate "
        "when --model is given; write the fastest config and a ranked table.",
    )
    p.add_argument("--config", required=True, help="the base ds/DeepSpeed config the script reads")
    p.add_argument("--nproc", type=int, default=2, help="processes per trial (ds run --nproc)")
    p.add_argument("--stages", type=_ints, default=[0, 1, 2, 3])
    p.add_argument("--micro", type=_ints, default=[1, 2, 4], help="micro-batch sizes per rank")
    p.add_argument("--offload", default="none,cpu", help="optimizer offload: none, cpu")
    p.add_argument("--buckets", type=_ints, default=None, help="reduce/allgather bucket sizes")
    p.add_argument("--start-step", type=int, default=3, help="steps before timing (warm-up)")
    p.add_argument("--end-step", type=int, default=8, help="the last timed step; the trial ends")
    p.add_argument("--trial-timeout", type=float, default=300.0, help="seconds per trial")
    p.add_argument("--model", help="a transformers config.json: prune points with ds estimate")
    p.add_argument("--seq-len", type=int, default=128, help="tokens per sample, for --model")
    p.add_argument(
        "--memory-limit", type=_bytes, help="per-rank bytes a point may need (with --model)"
    )
    p.add_argument("--out", default="autotune_results", help="folder for configs and results")
    p.add_argument("script", nargs=argparse.REMAINDER, help="the training script and its args")
    return p


def main(argv: list[str], *, initialize: Callable[..., Any], harness: TrialHarness) -> int:
    """``ds autotune``; ``initialize`` is the engine ``--model`` estimates measure, ``harness``
    how each trial runs the script (both wired by ``ds.full``)."""
    args = _parser().parse_args(argv)
    try:
        return _run(args, initialize, harness)
    except DsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _estimator(
    args: argparse.Namespace, base: dict[str, Any], initialize: Callable[..., Any]
) -> Any:
    import torch

    from ds.autotune.estimate import estimate
    from ds.autotune.model_spec import from_hf_config

    dtype = "bf16" if (base.get("bf16") or {}).get("enabled") is True else "fp32"
    if (base.get("fp16") or {}).get("enabled") is True:
        dtype = "fp16"
    spec = from_hf_config(args.model, getattr(torch, {"bf16": "bfloat16", "fp16": "float16"}.get(
        dtype, "float32")))  # fmt: skip
    on_gpu = torch.cuda.is_available()

    def bytes_of(p: Any) -> int:
        # The simulated ranks' engines would log "engine ready" for every point.
        quiet = logging.getLogger("ds")
        level = quiet.level
        quiet.setLevel(logging.WARNING)
        try:
            return _one(p)
        finally:
            quiet.setLevel(level)

    def _one(p: Any) -> int:
        (row,) = estimate(
            spec, args.nproc, initialize=initialize, stages=[p.stage], offloads=[p.offload],
            micro_batch=p.micro_batch, seq_len=args.seq_len, dtype=dtype,
            gpus_per_node=min(args.nproc, 8), backend="nccl" if on_gpu else "gloo",
        )  # fmt: skip
        # On a GPU the limit is device memory; a CPU run holds both "device" and host bytes.
        return int(row.device_peak if on_gpu else row.device_peak + row.host_peak)

    return bytes_of


def _run(args: argparse.Namespace, initialize: Callable[..., Any], harness: TrialHarness) -> int:
    from ds.autotune import tune
    from ds.interfaces.errors import ConfigError

    script = [a for a in args.script if a != "--"]
    if not script:
        raise ConfigError("give the training script after the options: ds autotune ... train.py")
    try:
        with open(args.config, encoding="utf-8") as f:
            base = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"--config {args.config}: cannot read it as JSON ({e})") from e
    if not 0 <= args.start_step < args.end_step:
        raise ConfigError(
            f"--start-step {args.start_step} and --end-step {args.end_step}: need "
            "0 <= start < end (steps start+1..end are timed)"
        )
    buckets = args.buckets or [None]
    pts, skipped = tune.points(
        base, args.nproc, args.stages, args.micro, args.offload.split(","), buckets
    )
    for line in skipped:
        print(f"skipped {line}", flush=True)
    if not pts:
        raise ConfigError("the search space is empty: no micro-batch size divides the batch")
    if args.model:
        tune.prune(pts, _estimator(args, base, initialize), args.memory_limit)
        live = [p for p in pts if p.status != "pruned"]
        if not live:
            small = min(pts, key=lambda p: p.estimate_bytes or 0)
            raise ConfigError(
                f"no point fits --memory-limit {tune._size(args.memory_limit)}: the smallest needs "
                f"{tune._size(small.estimate_bytes)} per rank ({small.label}); raise the limit, "
                "add offload or a higher stage, or use more ranks"
            )
    elif args.memory_limit is not None:
        raise ConfigError("--memory-limit needs --model (the estimate prunes by model config)")
    todo = [p for p in pts if p.status == "pending"]
    os.makedirs(args.out, exist_ok=True)
    for i, p in enumerate(todo, 1):
        print(f"[{i}/{len(todo)}] {p.label} ...", end=" ", flush=True)
        tune.run_trial(
            p, script=script, base_config_path=args.config, nproc=args.nproc,
            workdir=args.out, index=i, start=args.start_step, end=args.end_step,
            timeout_s=args.trial_timeout, harness=harness,
        )  # fmt: skip
        done = f"{p.samples_per_s:.2f} samples/s" if p.status == "timed" else p.why
        print(f"{done} ({p.trial_s:.1f} s)", flush=True)
    ranked = tune.rank_points(pts)
    table = tune.format_table(ranked)
    print(table)
    with open(os.path.join(args.out, "results.json"), "w", encoding="utf-8") as f:
        json.dump([p.as_dict() for p in ranked], f, indent=1)
    with open(os.path.join(args.out, "results.txt"), "w", encoding="utf-8") as f:
        f.write(table + "\n")
    best = ranked[0]
    if best.status != "timed":
        print("error: no trial finished; see the table for why", file=sys.stderr)
        return 1
    path = os.path.join(args.out, "best_config.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(best.config, f, indent=1)
        f.write("\n")
    print(f"best: {best.label}, {best.samples_per_s:.2f} samples/s -> {path}")
    return 0
