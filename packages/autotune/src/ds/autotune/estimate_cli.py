"""``ds estimate``: per-rank memory of each ZeRO stage and offload setting for a model and world.

The composition root registers the verb and hands :func:`main` the engine to measure."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from ds.interfaces.errors import DsError


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers") from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ds estimate",
        description="Per-rank device and host bytes for ZeRO stages 0-3 and offload settings, "
        "measured by running ds's engine on a simulated GPU world, beside DeepSpeed's formulae.",
    )
    p.add_argument("--model", required=True, help="a transformers config.json, or its directory")
    p.add_argument("--world", type=_ints, default=[8], help="world sizes, e.g. 8,64,512")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--stages", type=_ints, default=[0, 1, 2, 3])
    p.add_argument(
        "--offload", default="none,cpu", help="none, cpu (optimizer), cpu+param (stage 3)"
    )
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--seq-len", type=int, default=16, help="tokens per sample (activations)")
    p.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    p.add_argument(
        "--backend",
        choices=["nccl", "gloo"],
        default="nccl",
        help="the collectives' backend: nccl (GPUs) or gloo (CPU runs)",
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
        rows = []
        for world in args.world:
            rows += estimate(
                spec,
                world,
                initialize=initialize,
                stages=args.stages,
                offloads=args.offload.split(","),
                micro_batch=args.micro_batch,
                seq_len=args.seq_len,
                dtype=args.dtype,
                gpus_per_node=args.gpus_per_node,
                backend=args.backend,
            )
    except DsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({**describe(spec), "rows": [r.as_dict() for r in rows]}, indent=1))
    else:
        print(format_table(spec, rows))
    return 0
