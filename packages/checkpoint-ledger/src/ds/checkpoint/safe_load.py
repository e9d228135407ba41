"""Loading checkpoint files without running code from them, after checking their recorded hashes.

Every pickle a checkpoint holds is read with ``torch.load(weights_only=True)``: tensors, numbers,
strings and containers only, plus the few harmless types checkpoints really contain (NumPy's RNG
state arrays; DeepSpeed's bookkeeping objects, mapped onto inert stand-ins by
:mod:`ds.checkpoint.deepspeed_format`). A file whose SHA-256 differs from the one recorded at save
time is refused, naming the file, before any byte of it is used.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from typing import Any

import torch

from ds.interfaces.errors import CheckpointError


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(16 << 20):
            h.update(chunk)
    return h.hexdigest()


def check_hash(path: str, expected: str | None) -> None:
    """Raise if ``path``'s SHA-256 is not ``expected`` (nothing to check when None)."""
    if not expected:
        return
    try:
        got = sha256_file(path)
    except FileNotFoundError as exc:
        raise CheckpointError(f"{path} is missing; the checkpoint is incomplete") from exc
    if got != expected:
        raise CheckpointError(
            f"{path}: SHA-256 {got[:16]}... differs from the {expected[:16]}... recorded when the "
            "checkpoint was saved; the file was changed or damaged, so nothing was loaded "
            "(restore it, load an earlier tag, or run 'ds checkpoint verify' for a full report)"
        )


def _numpy_globals() -> list[Any]:
    try:
        import numpy as np
    except ImportError:
        return []
    out: list[Any] = [np.ndarray, np.dtype]
    core = getattr(np, "_core", None) or getattr(np, "core", None)
    multiarray = getattr(core, "multiarray", None)
    if multiarray is not None and hasattr(multiarray, "_reconstruct"):
        out.append(multiarray._reconstruct)
        # numpy 2 pickles arrays with numpy._core.multiarray; numpy 1 with numpy.core.multiarray
        out.append((multiarray._reconstruct, "numpy.core.multiarray._reconstruct"))
        out.append((multiarray._reconstruct, "numpy._core.multiarray._reconstruct"))
    dtypes = getattr(np, "dtypes", None)
    if dtypes is not None:
        out += [getattr(dtypes, n) for n in dir(dtypes) if n.endswith("DType")]
    return out


def safe_torch_load(
    path: str,
    *,
    sha256: str | None = None,
    extra_globals: Iterable[Any] = (),
    mmap: bool = False,
) -> Any:
    """``torch.load(path, weights_only=True)`` after checking ``sha256`` (when recorded)."""
    check_hash(path, sha256)
    allowed = _numpy_globals() + list(extra_globals)
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except FileNotFoundError as exc:
        raise CheckpointError(f"{path} is missing; the checkpoint is incomplete") from exc
    except Exception as exc:
        if "weights_only" in str(exc) or "Unsupported global" in str(exc):
            raise CheckpointError(
                f"{os.path.basename(path)} holds an object ds will not unpickle (only tensors, "
                f"numbers, strings and containers load): {str(exc).splitlines()[0]}. Keep "
                "client_state to plain data, or convert the object before saving"
            ) from exc
        raise CheckpointError(f"{path} cannot be read: {type(exc).__name__}: {exc}") from exc


def verify_files_read(
    root: str, manifest: dict[str, Any], requests: Iterable[Any], rank: int, rank_objects: bool
) -> None:
    """Check the recorded SHA-256 of every file a load of ``requests`` reads on this rank."""
    from ds.checkpoint import _format as fmt

    names = {fmt.OBJECTS}
    if rank_objects and rank < int(manifest["world_size"]):
        names.add(fmt.rank_objects_file(rank))
    tensors = manifest["tensors"]
    for req in requests:
        entry = tensors.get(req.name)
        if entry is None:
            continue  # the reader names the missing tensor
        stop = req.offset + req.numel
        for shard in entry["shards"]:
            if shard["offset"] < stop and shard["offset"] + shard["numel"] > req.offset:
                names.add(shard["file"])
    files = manifest.get("files", {})
    for name in sorted(names):
        check_hash(os.path.join(root, name), (files.get(name) or {}).get("sha256"))
