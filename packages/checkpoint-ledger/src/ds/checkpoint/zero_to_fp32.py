#!/usr/bin/env python
"""Consolidate the ZeRO checkpoint in this folder into one fp32 model, with ds.

ds's engines copy this file, as ``zero_to_fp32.py``, beside the ``latest`` file of every ZeRO
checkpoint they save: the place and the arguments DeepSpeed's users know. It does what
``ds checkpoint export CHECKPOINT_DIR OUTPUT_DIR`` does, for ds and DeepSpeed checkpoints alike:

    python zero_to_fp32.py . OUTPUT_DIR [-t TAG] [--safe_serialization] [--max_shard_size 5GB]
                                         [--exclude_frozen_parameters] [-d]

OUTPUT_DIR (a folder, created if missing) receives ``pytorch_model.bin``, or ``model.safetensors``
with ``--safe_serialization``; weights larger than ``--max_shard_size`` are split into numbered
files plus the ``*.index.json`` that ``transformers``' ``from_pretrained`` reads. Tensors are read
one at a time from the checkpoint's shards, so the whole model never sits in memory at once.

The work is ds's (``ds.checkpoint.deepspeed_export``): this file holds only the command line, so a
copy left in an old checkpoint runs with the ds installed now.
"""

from __future__ import annotations

import argparse
import logging
import sys

INSTALL = "pip install ds-checkpoint-ledger"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Write the fp32 weights of a ds or DeepSpeed ZeRO checkpoint as "
        "pytorch_model.bin or model.safetensors (the files from_pretrained reads)."
    )
    add = p.add_argument
    add("checkpoint_dir", help="the folder holding 'latest' and the tag folders, e.g. .")
    add("output_dir", help="folder for the weights files (created if missing), e.g. ./fp32")
    add("--max_shard_size", default="5GB", help="largest output file, e.g. 5GB (default), 500MB")
    add("--safe_serialization", action="store_true", help="write safetensors, not pickled .bin")
    add("-t", "--tag", default=None, help="tag folder to read (default: the one 'latest' names)")
    add("--exclude_frozen_parameters", action="store_true", help="leave out frozen parameters")
    add("-d", "--debug", action="store_true", help="log what the export does")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        from ds.checkpoint.deepspeed_export import export_fp32
        from ds.interfaces.errors import DsError
    except ImportError as exc:
        print(f"error: this script needs ds installed: {INSTALL} ({exc})", file=sys.stderr)
        return 1
    if args.debug:
        logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)
    try:
        files = export_fp32(
            args.checkpoint_dir,
            args.output_dir,
            tag=args.tag,
            max_shard_size=args.max_shard_size,
            safe_serialization=args.safe_serialization,
            exclude_frozen_parameters=args.exclude_frozen_parameters,
        )
    except (DsError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for path in files:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
