"""``zero_to_fp32``-style export of DeepSpeed and ds checkpoints: fp32 weights, HF file names.

``export_fp32(checkpoint_dir, output_dir, ...)`` writes what DeepSpeed's ``zero_to_fp32.py`` writes
(``pytorch_model.bin`` or ``model.safetensors``, or numbered shards plus the ``*.index.json`` that
``from_pretrained`` reads when ``max_shard_size`` splits them) from either kind of checkpoint. It
streams: safetensors shards are written tensor by tensor (peak memory about the largest tensor);
torch shards hold one shard's tensors at a time (peak about ``max_shard_size``). DeepSpeed's
script first gathers the whole model in memory.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ds.interfaces.errors import CheckpointError

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}  # fmt: skip


def parse_size(text: str | int) -> int:
    """``"5GB"`` -> 5_000_000_000 (decimal units as in huggingface_hub; ``GiB`` binary)."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise CheckpointError(
            f"--max_shard_size {text!r} is not a size; write e.g. 5GB, 500MB or 2GiB"
        )
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


@dataclass(frozen=True)
class Entry:
    """One output tensor: its name, shape, dtype and how to read it (whole, fp32)."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    read: Callable[[], torch.Tensor]

    @property
    def nbytes(self) -> int:
        n = self.dtype.itemsize
        for s in self.shape:
            n *= s
        return n


def _deepspeed_entries(directory: str, tag: str | None, exclude_frozen: bool) -> list[Entry]:
    from ds.checkpoint.deepspeed_format import DeepSpeedCheckpoint

    ck = DeepSpeedCheckpoint(directory, tag)
    out = []
    for n, t in ck.tensors.items():
        kind, _, name = n.partition(".")
        if kind == "module":
            src = ck.tensors.get(f"master.{name}", t)
        elif kind == "buffer" or (kind == "frozen" and not exclude_frozen):
            src = t
        else:
            continue
        dtype = torch.float32 if kind == "module" else getattr(torch, src.meta.dtype)

        def read(src: Any = src, dtype: torch.dtype = dtype) -> torch.Tensor:
            t: torch.Tensor = src.read(0, src.meta.numel)
            return t.to(dtype).reshape(src.meta.shape)

        out.append(Entry(name, tuple(src.meta.shape), dtype, read))
    return out


def _ds_entries(directory: str, tag: str | None, exclude_frozen: bool) -> list[Entry]:
    from ds.checkpoint._reader import FileCache, dtype_from_name, read_range, tensor_metas
    from ds.checkpoint.engine import ShardedCheckpointEngine
    from ds.checkpoint.export import check_shards

    eng = ShardedCheckpointEngine()
    root = eng.checkpoint_dir(directory, tag)
    manifest = eng.manifest(directory, tag)
    check_shards(manifest, root)  # refuse a changed shard before reading it
    metas = tensor_metas(manifest)
    files = FileCache(root)
    out = []
    for src, meta in sorted(metas.items()):
        kind, _, name = src.partition(".")
        if kind == "module":
            src = f"master.{name}" if f"master.{name}" in metas else src
            dtype = torch.float32
        elif kind == "buffer" or (kind == "frozen" and not exclude_frozen):
            dtype = dtype_from_name(meta.dtype)  # as saved, as for DeepSpeed checkpoints
        else:
            continue

        def read(src: str = src, meta: Any = meta, dtype: torch.dtype = dtype) -> torch.Tensor:
            t = read_range(manifest, files, src, 0, meta.numel)
            return t.to(dtype).reshape(meta.shape)

        out.append(Entry(name, tuple(meta.shape), dtype, read))
    return out


def entries(directory: str, tag: str | None = None, *, exclude_frozen: bool = False) -> list[Entry]:
    from ds.checkpoint.deepspeed_format import is_deepspeed_checkpoint
    from ds.checkpoint.pipeline_format import pipeline_entries, pipeline_root

    root = pipeline_root(directory, tag)
    if root is not None:
        return pipeline_entries(root, exclude_frozen)
    if is_deepspeed_checkpoint(directory, tag):
        return _deepspeed_entries(directory, tag, exclude_frozen)
    return _ds_entries(directory, tag, exclude_frozen)


def _shards(items: list[Entry], limit: int) -> list[list[Entry]]:
    shards: list[list[Entry]] = [[]]
    size = 0
    for e in items:
        if shards[-1] and size + e.nbytes > limit:
            shards.append([])
            size = 0
        shards[-1].append(e)
        size += e.nbytes
    return shards


def _write_safetensors(path: str, items: list[Entry]) -> None:
    from ds.checkpoint.export import SAFETENSORS_DTYPES

    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    pos = 0
    for e in items:
        header[e.name] = {
            "dtype": SAFETENSORS_DTYPES[e.dtype],
            "shape": list(e.shape),
            "data_offsets": [pos, pos + e.nbytes],
        }
        pos += e.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    tmp = path + ".partial"
    with open(tmp, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for e in items:
            t = e.read().contiguous()
            if t.numel():
                f.write(t.view(torch.uint8).numpy().data)
            del t
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _write_torch(path: str, items: list[Entry]) -> None:
    state = {e.name: e.read().contiguous() for e in items}
    tmp = path + ".partial"
    torch.save(state, tmp)
    os.replace(tmp, path)


def export_fp32(
    checkpoint_dir: str,
    output_dir: str,
    *,
    tag: str | None = None,
    max_shard_size: str | int = "5GB",
    safe_serialization: bool = False,
    exclude_frozen_parameters: bool = False,
) -> list[str]:
    """Write the consolidated fp32 state dict; returns the files written (index last)."""
    items = entries(checkpoint_dir, tag, exclude_frozen=exclude_frozen_parameters)
    if not items:
        raise CheckpointError(f"{checkpoint_dir}: the checkpoint holds no parameters to export")
    shards = _shards(items, parse_size(max_shard_size))
    os.makedirs(output_dir, exist_ok=True)
    stem, ext = ("model", "safetensors") if safe_serialization else ("pytorch_model", "bin")
    written: list[str] = []
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards, 1):
        name = f"{stem}.{ext}" if len(shards) == 1 else f"{stem}-{i:05d}-of-{len(shards):05d}.{ext}"
        path = os.path.join(output_dir, name)
        (_write_safetensors if safe_serialization else _write_torch)(path, shard)
        written.append(path)
        weight_map.update({e.name: name for e in shard})
    if len(shards) > 1:
        index = {
            "metadata": {"total_size": sum(e.nbytes for e in items)},
            "weight_map": weight_map,
        }
        path = os.path.join(output_dir, f"{stem}.{ext}.index.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(index, f, indent=2, sort_keys=True)
            f.write("\n")
        written.append(path)
    return written


def iter_state_dict(directory: str, tag: str | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    for e in entries(directory, tag):
        yield e.name, e.read()


def main_from_args(args: Any) -> int:
    """``ds checkpoint export DIR OUTPUT_DIR`` (or ``--out DIR``) in zero_to_fp32.py's manner."""
    out = args.output_dir or args.out
    if out is None:
        raise CheckpointError("give the output folder: ds checkpoint export DIR OUTPUT_DIR")
    safe = bool(args.safe_serialization) or (args.output_dir is None and args.to == "safetensors")
    files = export_fp32(
        args.directory,
        out,
        tag=args.tag,
        max_shard_size=args.max_shard_size,
        safe_serialization=safe,
        exclude_frozen_parameters=args.exclude_frozen_parameters,
    )
    for f in files:
        print(f"wrote {f}")
    return 0
