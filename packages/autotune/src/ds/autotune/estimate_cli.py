"""``ds estimate``: per-rank memory of each ZeRO stage and offload setting for a model and world.

The composition root registers the verb and hands :func:`main` the engine to measure."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ds.interfaces.errors import ConfigError, DsError


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers") from None


def _offloads(text: str) -> list[str]:
    from ds.autotune.estimate import OFFLOADS

    chosen = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in chosen if x not in OFFLOADS]
    if bad or not chosen:
        raise argparse.ArgumentTypeError(
            f"{', '.join(map(repr, bad)) or repr(text)}: choose from {', '.join(OFFLOADS)} "
            "(comma-separated)"
        )
    return chosen


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ds estimate",
        description="Per-rank device and host bytes for ZeRO stages 0-3 and offload settings, "
        "measured by running ds's engine on a simulated world (GPU ranks, or CPU ranks with "
        "--backend gloo), beside DeepSpeed's formulae.",
    )
    p.add_argument("--model", required=True, help="a transformers config.json, or its directory")
    p.add_argument("--world", type=_ints, default=[8], help="world sizes, e.g. 8,64,512")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--stages", type=_ints, default=[0, 1, 2, 3])
    p.add_argument(
        "--offload",
        type=_offloads,
        default="none,cpu",
        help="comma-separated: none, cpu (optimizer), cpu+param (stage 3), nvme (optimizer, "
        "stage 3), nvme+param (optimizer and parameters, stage 3)",
    )
    p.add_argument(
        "--nvme-path",
        help="directory for the NVMe swap files (nvme offloads; the engine checks its room, no "
        "bytes are written); default: a temporary directory",
    )
    p.add_argument(
        "--config",
        help="the job's DeepSpeed JSON config: its settings (buffer counts, live-parameter "
        "limits, optimizer, ...) apply to every point except stage, offload, micro-batch and dtype",
    )
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--seq-len", type=int, default=16, help="tokens per sample (activations)")
    p.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    p.add_argument(
        "--backend",
        choices=["nccl", "gloo"],
        default="nccl",
        help="the collectives' backend: nccl (GPU ranks) or gloo (CPU ranks: device and host "
        "are one memory, reported as device bytes)",
    )
    p.add_argument("--json", action="store_true", help="print JSON rows instead of a table")
    return p


def main(argv: list[str], *, initialize: Callable[..., Any]) -> int:
    """``ds estimate``; ``initialize`` is the engine to measure (wired by ``ds.full``)."""
    args = _parser().parse_args(argv)
    import torch

    from ds.autotune.estimate import estimate, format_table
    from ds.autotune.model_spec import describe, from_hf_config

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    try:
        spec = from_hf_config(args.model, dtype)
        job = _job_config(args.config)
        with _nvme_dir(args.nvme_path, args.offload) as nvme_path:
            rows = []
            for world in args.world:
                rows += estimate(
                    spec,
                    world,
                    initialize=initialize,
                    stages=args.stages,
                    offloads=args.offload,
                    micro_batch=args.micro_batch,
                    seq_len=args.seq_len,
                    dtype=args.dtype,
                    gpus_per_node=args.gpus_per_node,
                    backend=args.backend,
                    nvme_path=nvme_path,
                    config=job,
                )
    except DsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({**describe(spec), "rows": [r.as_dict() for r in rows]}, indent=1))
    else:
        print(format_table(spec, rows))
    return 0


def _job_config(path: str | None) -> dict[str, Any] | None:
    if path is None:
        return None
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--config {path}: cannot read it as a JSON config ({exc})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"--config {path}: a DeepSpeed config is a JSON object")
    return raw


@contextlib.contextmanager
def _nvme_dir(path: str | None, offloads: list[str]) -> Iterator[str | None]:
    """The swap directory of the NVMe points: ``path``, or a temporary one removed afterwards
    (the engine creates its swap files; the simulation writes nothing into them)."""
    if path is not None or not any(o.startswith("nvme") for o in offloads):
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="ds-estimate-nvme-") as tmp:
        yield tmp
