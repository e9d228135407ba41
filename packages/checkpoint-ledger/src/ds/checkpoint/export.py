"""Consolidate a sharded checkpoint into one safetensors or torch file, one tensor at a time.

Both writers lay out the file's metadata first (safetensors header; torch's pickled structure),
then read each logical tensor from the shards, write its bytes and drop it, so peak memory stays
near the largest tensor rather than the model. The torch file is the zip format ``torch.save``
writes and ``torch.load(weights_only=True)`` reads.
"""

from __future__ import annotations

import collections
import contextlib
import fnmatch
import json
import os
import pickle
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, SupportsIndex

import torch

from ds.checkpoint._fsutil import fsync_path
from ds.checkpoint._reader import FileCache, dtype_from_name, read_range, tensor_metas
from ds.interfaces.errors import CheckpointError

SAFETENSORS_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}


@dataclass(frozen=True)
class ExportPlan:
    """Which checkpoint tensor goes out under which name, shape and dtype."""

    source: str
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype


def plan_export(
    manifest: Mapping[str, Any],
    *,
    dtype: torch.dtype | None = None,
    rename: Callable[[str], str | None] | None = None,
) -> list[ExportPlan]:
    """``dtype`` casts floating tensors only; ``rename`` maps names (None drops a tensor)."""
    plans = []
    seen: dict[str, str] = {}
    for src, meta in sorted(tensor_metas(manifest).items()):
        name = rename(src) if rename is not None else src
        if name is None:
            continue
        if name in seen:
            raise CheckpointError(f"tensors {seen[name]!r} and {src!r} both export as {name!r}")
        seen[name] = src
        dt = dtype_from_name(meta.dtype)
        if dtype is not None and dt.is_floating_point:
            dt = dtype
        plans.append(ExportPlan(src, name, meta.shape, dt))
    return plans


def make_renamer(
    name_map: Mapping[str, str] | None = None,
    strip_prefix: str | None = None,
    add_prefix: str | None = None,
    include: list[str] | None = None,
) -> Callable[[str], str | None]:
    """Names as Hugging Face expects them: explicit map, then prefix strip/add; glob filter."""

    def rename(name: str) -> str | None:
        if include and not any(fnmatch.fnmatchcase(name, pat) for pat in include):
            return None
        if name_map and name in name_map:
            return name_map[name]
        if strip_prefix and name.startswith(strip_prefix):
            name = name[len(strip_prefix) :]
        if add_prefix:
            name = add_prefix + name
        return name

    return rename


def check_shards(manifest: Mapping[str, Any], root: str) -> None:
    """Refuse a checkpoint whose shard files differ from the SHA-256 in its manifest, before
    anything is read from them or written (the error names the file)."""
    from ds.checkpoint._format import CheckpointDamagedError
    from ds.checkpoint.safe_load import check_hash

    for name, info in sorted(manifest["files"].items()):
        if name.startswith("shard-"):
            try:
                check_hash(os.path.join(root, name), info.get("sha256"))
            except CheckpointError as exc:
                raise CheckpointDamagedError(str(exc)) from exc


class _Source:
    """Reads one logical tensor at a time into a single reused buffer sized for the largest.

    Reusing one buffer keeps peak memory at the largest tensor: fresh allocations per tensor
    let the C allocator keep freed mid-sized blocks, which can double the peak.
    """

    def __init__(self, manifest: Mapping[str, Any], root: str, plans: list[ExportPlan]) -> None:
        check_shards(manifest, root)
        self._manifest = manifest
        self._files = FileCache(root)
        metas = tensor_metas(manifest)
        self._src_dtype = {p.source: dtype_from_name(metas[p.source].dtype) for p in plans}
        largest = max(
            (_numel(p.shape) * self._src_dtype[p.source].itemsize for p in plans), default=0
        )
        self._buf = torch.empty(largest, dtype=torch.uint8)

    def read(self, plan: ExportPlan) -> torch.Tensor:
        dt = self._src_dtype[plan.source]
        numel = _numel(plan.shape)
        out = self._buf[: numel * dt.itemsize].view(dt)
        t = read_range(self._manifest, self._files, plan.source, 0, numel, out=out)
        return t.to(plan.dtype) if dt != plan.dtype else t

    def close(self) -> None:
        self._files.close()


@contextlib.contextmanager
def _replacing(out: str, source: _Source) -> Iterator[str]:
    """The path to write ``out`` at (``out.partial``); when the block ends it takes the place of
    ``out`` durably, and on an error no partial file is left. ``source`` is closed either way."""
    tmp = out + ".partial"
    try:
        yield tmp
        os.replace(tmp, out)
        fsync_path(os.path.dirname(os.path.abspath(out)))
    finally:
        source.close()
        if os.path.exists(tmp):
            os.unlink(tmp)


def export_safetensors(
    manifest: Mapping[str, Any],
    root: str,
    out: str,
    plans: list[ExportPlan],
    metadata: Mapping[str, str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> int:
    header: dict[str, Any] = {"__metadata__": {"format": "pt", **(metadata or {})}}
    pos = 0
    for p in plans:
        if p.dtype not in SAFETENSORS_DTYPES:
            raise CheckpointError(f"{p.source}: dtype {p.dtype} has no safetensors encoding")
        nbytes = torch.empty(0, dtype=p.dtype).element_size()
        for s in p.shape:
            nbytes *= s
        header[p.name] = {
            "dtype": SAFETENSORS_DTYPES[p.dtype],
            "shape": list(p.shape),
            "data_offsets": [pos, pos + nbytes],
        }
        pos += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data section starts 8-byte aligned
    source = _Source(manifest, root, plans)
    with _replacing(out, source) as tmp, open(tmp, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for p in plans:
            t = source.read(p)
            if t.numel():
                f.write(t.view(torch.uint8).numpy().data)
            del t
            if progress is not None:
                progress(p.name)
        f.flush()
        os.fsync(f.fileno())
    return 8 + len(raw) + pos


class _StorageRef:
    def __init__(self, key: str, dtype: torch.dtype, numel: int) -> None:
        self.key, self.dtype, self.numel = key, dtype, numel


class _LazyTensor:
    """Pickles exactly like a contiguous CPU tensor whose storage is written separately."""

    def __init__(self, ref: _StorageRef, shape: tuple[int, ...]) -> None:
        self.ref, self.shape = ref, shape

    def __reduce_ex__(self, protocol: SupportsIndex) -> Any:
        stride, acc = [], 1
        for s in reversed(self.shape):
            stride.append(acc)
            acc *= s
        args: tuple[Any, ...] = (
            self.ref,
            0,
            self.shape,
            tuple(reversed(stride)),
            False,
            collections.OrderedDict(),
        )
        return (torch._utils._rebuild_tensor_v2, args)


def _storage_type(dtype: torch.dtype) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TypedStorage is deprecated but is what the format names
        storage = torch.storage.TypedStorage(dtype=dtype, device="cpu")  # type: ignore[no-untyped-call]
        name = storage._pickle_storage_type()  # type: ignore[no-untyped-call]
    return getattr(torch, name)


def export_torch(
    manifest: Mapping[str, Any],
    root: str,
    out: str,
    plans: list[ExportPlan],
    progress: Callable[[str], None] | None = None,
) -> int:
    refs = [_StorageRef(str(i), p.dtype, _numel(p.shape)) for i, p in enumerate(plans)]
    state = {p.name: _LazyTensor(r, p.shape) for p, r in zip(plans, refs, strict=True)}

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj: Any) -> Any:
            if isinstance(obj, _StorageRef):
                return ("storage", _storage_type(obj.dtype), obj.key, "cpu", obj.numel)
            return None

    import io

    buf = io.BytesIO()
    Pickler(buf, protocol=2).dump(state)
    data = buf.getvalue()
    source = _Source(manifest, root, plans)
    total = len(data)
    with _replacing(out, source) as tmp:
        writer = torch._C.PyTorchFileWriter(tmp)
        writer.write_record("data.pkl", data, len(data))
        writer.write_record(".format_version", b"1", 1)
        writer.write_record("byteorder", sys.byteorder.encode(), len(sys.byteorder))
        for p, r in zip(plans, refs, strict=True):
            t = source.read(p)
            nbytes = t.numel() * t.element_size()
            # The record is the first nbytes of the storage: the reused buffer starts with t.
            assert t.storage_offset() == 0
            writer.write_record(f"data/{r.key}", t.untyped_storage(), nbytes)  # type: ignore[arg-type]
            total += nbytes
            del t
            if progress is not None:
                progress(p.name)
        writer.write_end_of_file()
        del writer
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
    return total


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
