"""``ds checkpoint inspect | verify | export | universal``: the checkpoint verbs of the ds CLI."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from typing import Any

from ds.interfaces.errors import DsError

_DTYPES = {
    "fp32": "float32",
    "fp16": "float16",
    "bf16": "bfloat16",
    "float32": "float32",
    "float16": "float16",
    "bfloat16": "bfloat16",
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ds checkpoint", description="Inspect, verify and export ds checkpoints."
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    i = sub.add_parser("inspect", help="print a checkpoint's manifest summary")
    i.add_argument("directory")
    i.add_argument("--tag", default=None, help="checkpoint tag (default: the one 'latest' names)")
    i.add_argument("--json", action="store_true", help="print the manifest as JSON")
    v = sub.add_parser("verify", help="re-hash every file; cross-check the run ledger")
    v.add_argument("directory")
    v.add_argument("--tag", default=None)
    v.add_argument(
        "--ledger", default=None, help="run ledger to find this checkpoint's save record in"
    )
    v.add_argument(
        "--public-key",
        default=None,
        help="hex Ed25519 key the ledger's heads (and the checkpoint's) must be signed by",
    )
    v.add_argument(
        "--strict",
        action="store_true",
        help="also fail when no checksums were recorded or the ledger's heads are unsigned",
    )
    e = sub.add_parser(
        "export",
        help="write consolidated weights (streaming, tensor by tensor); of ds or DeepSpeed "
        "checkpoints, also as DeepSpeed's zero_to_fp32.py does: DIR OUTPUT_DIR [options]",
    )
    e.add_argument("directory")
    e.add_argument(
        "output_dir",
        nargs="?",
        default=None,
        help="zero_to_fp32.py form: fp32 weights into this folder, Hugging Face file names",
    )
    e.add_argument("-t", "--tag", default=None)
    e.add_argument(
        "--format",
        choices=["weights", "deepspeed"],
        default="weights",
        help="weights: consolidated weights (default); deepspeed: the whole training state in "
        "DeepSpeed 0.19.8's checkpoint layout, into OUTPUT_DIR, for deepspeed's load_checkpoint",
    )
    e.add_argument("--zero-stage", type=int, default=None, help="--format deepspeed: 1 or 2")
    e.add_argument(
        "--world-size",
        type=int,
        default=1,
        help="--format deepspeed: data-parallel size to load at",
    )
    e.add_argument(
        "--param-order",
        default=None,
        help="--format deepspeed: JSON file, the parameter names of each optimizer group in order "
        "(for tags that record none)",
    )
    e.add_argument("--to", choices=["safetensors", "torch"], default="safetensors")
    e.add_argument(
        "--out",
        default=None,
        help="output file, or a directory (gets model.safetensors or pytorch_model.bin)",
    )
    e.add_argument("--max_shard_size", "--max-shard-size", default="5GB", help="e.g. 5GB, 500MB")
    e.add_argument(
        "--safe_serialization",
        "--safe-serialization",
        action="store_true",
        help="zero_to_fp32.py form: write model*.safetensors (default pytorch_model*.bin)",
    )
    e.add_argument(
        "--exclude_frozen_parameters", "--exclude-frozen-parameters", action="store_true"
    )
    e.add_argument("--dtype", choices=sorted(_DTYPES), default=None, help="cast floating tensors")
    e.add_argument("--include", action="append", default=None, help="glob of tensor names to keep")
    e.add_argument("--strip-prefix", default=None, help="e.g. 'module.' or 'params.'")
    e.add_argument("--add-prefix", default=None)
    e.add_argument("--name-map", default=None, help="JSON file {checkpoint name: exported name}")
    e.add_argument(
        "--hf-config",
        default=None,
        help="a Hugging Face config.json to copy beside the weights (for from_pretrained)",
    )
    u = sub.add_parser(
        "universal",
        help="convert a DeepSpeed ZeRO checkpoint tag into DeepSpeed's universal layout "
        "(resumable at another data- or tensor-parallel degree): DIR OUTPUT_TAG_DIR",
    )
    u.add_argument("directory")
    u.add_argument(
        "output_dir", help="the universal tag folder to write (e.g. DIR/step5_universal)"
    )
    u.add_argument(
        "-t", "--tag", default=None, help="checkpoint tag (default: the one 'latest' names)"
    )
    u.add_argument(
        "--inject-missing-state",
        action="store_true",
        help="convert a tag whose writer recorded no universal-checkpoint info",
    )
    u.add_argument(
        "--no-strict", action="store_true", help="allow layout patterns matching nothing"
    )
    u.add_argument("--keep-temp", action="store_true", help="keep the fragments folder")
    return p


def _universal(args: argparse.Namespace) -> int:
    from ds.checkpoint.deepspeed_layout import _tag_dir
    from ds.checkpoint.universal_main import convert

    tag_dir = _tag_dir(args.directory, args.tag)
    if tag_dir is None:
        print(f"error: no checkpoint tag {args.tag!r} in {args.directory}", file=sys.stderr)
        return 2
    made = not os.path.exists(args.output_dir)
    try:
        convert(
            tag_dir,
            args.output_dir,
            inject_missing_state=args.inject_missing_state,
            strict=not args.no_strict,
            keep_temp=args.keep_temp,
        )
    except (AssertionError, NotImplementedError, RuntimeError, ValueError, OSError) as exc:
        # A layout the converter refuses, said in one line. The files written before it stopped
        # are no universal checkpoint: a directory this command made goes; one that was there
        # before is left to its owner, with a warning.
        print(f"error: {exc}", file=sys.stderr)
        if made:
            shutil.rmtree(args.output_dir, ignore_errors=True)
        else:
            print(f"error: {args.output_dir} may hold a partial conversion", file=sys.stderr)
        return 2
    print(f"universal checkpoint written to {args.output_dir}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from ds.checkpoint._format import CheckpointDamagedError

    try:
        verbs = {"inspect": _inspect, "verify": _verify, "export": _export, "universal": _universal}
        return int(verbs[args.cmd](args))
    except CheckpointDamagedError as exc:  # changed or damaged files: as verify's problems
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except DsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _engine() -> Any:
    from ds.checkpoint.engine import ShardedCheckpointEngine

    return ShardedCheckpointEngine()


def _inspect(args: argparse.Namespace) -> int:
    eng = _engine()
    m = eng.manifest(args.directory, args.tag)
    if args.json:
        print(json.dumps(m, indent=1, sort_keys=True))
        return 0
    from ds.checkpoint._reader import dtype_from_name

    total = 0
    rows = []
    for name, t in sorted(m["tensors"].items()):
        numel = 1
        for s in t["shape"]:
            numel *= s
        nbytes = numel * dtype_from_name(t["dtype"]).itemsize
        total += nbytes
        rows.append(
            (name, "x".join(map(str, t["shape"])) or "scalar", t["dtype"], len(t["shards"]))
        )
    print(f"checkpoint  {os.path.join(os.path.abspath(args.directory), m['tag'])}")
    print(f"tag         {m['tag']}   written by {m['world_size']} rank(s), ds {m['ds_version']}")
    print(
        f"tensors     {len(rows)}, {total / 2**20:.2f} MiB of tensor data, {len(m['files'])} files"
    )
    head = m.get("ledger_head")
    if head:
        signed = "signed" if head.get("signature") else "UNSIGNED"
        print(f"ledger head size {head['size']} root {head['root_hash'][:16]}... ({signed})")
    else:
        print("ledger head none (saved without a ledger)")
    width = max((len(r[0]) for r in rows), default=4)
    print(f"{'name':<{width}}  {'shape':<16} {'dtype':<10} shards")
    for name, shape, dtype, n in rows:
        print(f"{name:<{width}}  {shape:<16} {dtype:<10} {n}")
    return 0


def _verify(args: argparse.Namespace) -> int:
    import hashlib

    from ds.checkpoint import _format as fmt

    eng = _engine()
    root = eng.checkpoint_dir(args.directory, args.tag)
    problems = eng.verify(args.directory, args.tag)
    m = eng.manifest(args.directory, args.tag)
    files = m["files"]
    hashed = sum(1 for info in files.values() if info.get("sha256"))
    if args.public_key is not None and not args.ledger:
        raise DsError("--public-key pins the ledger's key; give the ledger with --ledger PATH")
    if args.strict and hashed < len(files):
        problems.append(
            f"{len(files) - hashed} of {len(files)} files have no recorded SHA-256 (saved with "
            "checkpoint.checksum: false); their content cannot be verified"
        )
    if args.ledger:
        with open(os.path.join(root, fmt.MANIFEST), "rb") as f:
            manifest_sha = hashlib.sha256(f.read()).hexdigest()
        from ds.checkpoint._ledger_check import cross_check_ledger

        problems += cross_check_ledger(
            args.ledger, root, m, manifest_sha, args.public_key, args.strict
        )
    for p in problems:
        print(f"FAIL {p}")
    if problems:
        print(f"checkpoint {m['tag']}: {len(problems)} problem(s)")
        return 1
    if args.ledger:
        from ds.checkpoint._ledger_check import RECOVERED, recovered_record

        index = recovered_record(args.ledger, manifest_sha)
        if index is not None:
            print(f"WARNING checkpoint {m['tag']}: {RECOVERED.format(i=index)}")
    if hashed == len(files):
        what = f"{len(files)} files match their SHA-256"
    elif hashed == 0:
        what = (
            f"{len(files)} files have the recorded sizes; NO checksums were recorded "
            "(checkpoint.checksum: false), so their content was not verified"
        )
    else:
        what = (
            f"{hashed} files match their SHA-256; {len(files) - hashed} have no recorded "
            "checksum and were checked by size only"
        )
    print(f"checkpoint {m['tag']}: OK ({what})")
    return 0


def _export(args: argparse.Namespace) -> int:
    import torch

    from ds.checkpoint import export as ex
    from ds.checkpoint.deepspeed_format import is_deepspeed_checkpoint
    from ds.checkpoint.pipeline_format import pipeline_root

    if args.format == "deepspeed":
        return _export_deepspeed(args)
    if (
        args.output_dir is not None
        or is_deepspeed_checkpoint(args.directory, args.tag)
        or pipeline_root(args.directory, args.tag) is not None
    ):
        from ds.checkpoint.deepspeed_export import main_from_args

        return main_from_args(args)
    if args.out is None:
        print(
            "error: ds checkpoint export needs --out FILE|DIR (or an OUTPUT_DIR)", file=sys.stderr
        )
        return 2
    eng = _engine()
    root = eng.checkpoint_dir(args.directory, args.tag)
    m = eng.manifest(args.directory, args.tag)
    name_map = None
    if args.name_map:
        with open(args.name_map, encoding="utf-8") as f:
            name_map = json.load(f)
    rename = ex.make_renamer(name_map, args.strip_prefix, args.add_prefix, args.include)
    dtype = getattr(torch, _DTYPES[args.dtype]) if args.dtype else None
    plans = ex.plan_export(m, dtype=dtype, rename=rename)
    out = args.out
    if os.path.isdir(out) or out.endswith(os.sep):
        os.makedirs(out, exist_ok=True)
        out = os.path.join(
            out, "model.safetensors" if args.to == "safetensors" else "pytorch_model.bin"
        )
    progress = _progress(len(plans))
    if args.to == "safetensors":
        n = ex.export_safetensors(m, root, out, plans, {"ds_tag": m["tag"]}, progress)
    else:
        n = ex.export_torch(m, root, out, plans, progress)
    if args.hf_config:
        shutil.copyfile(
            args.hf_config, os.path.join(os.path.dirname(os.path.abspath(out)), "config.json")
        )
    print(f"exported {len(plans)} tensors ({n / 2**20:.2f} MiB) to {out}")
    return 0


def _export_deepspeed(args: argparse.Namespace) -> int:
    from ds.checkpoint.deepspeed_writer import write_deepspeed

    if args.output_dir is None:
        print("error: --format deepspeed needs an OUTPUT_DIR", file=sys.stderr)
        return 2
    order = None
    if args.param_order:
        with open(args.param_order, encoding="utf-8") as f:
            order = json.load(f)
        order = [order] if order and isinstance(order[0], str) else order
    path = write_deepspeed(
        args.directory,
        args.output_dir,
        tag=args.tag,
        zero_stage=args.zero_stage,
        world_size=args.world_size,
        dtype=args.dtype,
        param_groups=order,
    )
    print(
        f"DeepSpeed checkpoint written to {path} (load it at data-parallel size {args.world_size})"
    )
    return 0


def _progress(total: int) -> Any:
    """A bar on a terminal; otherwise (logs, CI) one line per tenth of the tensors and the last."""
    from ds.checkpoint._progress import Progress

    progress = Progress("export", total, "tensors")
    return lambda _name: progress(1)
