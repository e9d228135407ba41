"""``ds checkpoint inspect | verify | export``: the checkpoint verbs of the ds CLI."""

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
    e = sub.add_parser("export", help="write consolidated weights (streaming, tensor by tensor)")
    e.add_argument("directory")
    e.add_argument("--tag", default=None)
    e.add_argument("--to", choices=["safetensors", "torch"], default="safetensors")
    e.add_argument(
        "--out",
        required=True,
        help="output file, or a directory (gets model.safetensors or pytorch_model.bin)",
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
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return int({"inspect": _inspect, "verify": _verify, "export": _export}[args.cmd](args))
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
    if args.ledger:
        with open(os.path.join(root, fmt.MANIFEST), "rb") as f:
            manifest_sha = hashlib.sha256(f.read()).hexdigest()
        problems += _cross_check_ledger(args.ledger, m, manifest_sha)
    for p in problems:
        print(f"FAIL {p}")
    if problems:
        print(f"checkpoint {m['tag']}: {len(problems)} problem(s)")
        return 1
    print(f"checkpoint {m['tag']}: OK ({len(m['files'])} files match their SHA-256)")
    return 0


def _cross_check_ledger(path: str, manifest: dict[str, Any], manifest_sha: str) -> list[str]:
    from ds.checkpoint import signing
    from ds.checkpoint.ledger import scan
    from ds.interfaces.ledger import TreeHead

    s = scan(path)
    problems = []
    if s.reason is not None:
        problems.append(f"ledger {path}: {s.reason}")
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")[: s.records]
    found = False
    for line in lines:
        rec = json.loads(line)
        if (
            rec["kind"] == "checkpoint_save"
            and rec["payload"].get("manifest_sha256") == manifest_sha
        ):
            found = True
            shas = rec["payload"].get("shard_sha256", {})
            for name, info in manifest["files"].items():
                if info.get("sha256") and shas.get(name) != info["sha256"]:
                    problems.append(f"ledger records a different SHA-256 for {name}")
    if not found:
        problems.append(f"ledger {path} has no checkpoint_save record of this manifest")
    head = manifest.get("ledger_head")
    if head:
        th = TreeHead(**head)
        if th.signature is not None and not signing.verify_head_signature(th):
            problems.append("the manifest's ledger tree head has an invalid signature")
        if th.size > len(s.tree) or s.tree.root(th.size).hex() != th.root_hash:
            problems.append("the manifest's ledger tree head does not match the ledger (rewritten)")
    return problems


def _export(args: argparse.Namespace) -> int:
    import torch

    from ds.checkpoint import export as ex

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


def _progress(total: int) -> Any:
    if not sys.stderr.isatty():
        return None
    from tqdm import tqdm  # type: ignore[import-untyped]

    bar = tqdm(total=total, unit="tensor", desc="export", file=sys.stderr)
    return lambda _name: bar.update(1)
