"""Room on the NVMe path for stage 3's swap files, checked before anything is written.

With ``offload_param`` or ``offload_optimizer`` on ``nvme`` each rank writes one swap file per
kind under ``nvme_path`` (``swap.py``): the parameter shards in their training dtype, and every
partition's fp32 master, ``exp_avg`` and ``exp_avg_sq``, each region aligned to the file's block.
A disk that fills up half way through writing them fails late and unclearly (a short write deep in
the I/O handle, after minutes of setup), so the engine adds up the bytes first and compares them
with the free space of each filesystem the paths lie on. Every rank on a node writes its own
files to the same paths, so a node needs ``LOCAL_WORLD_SIZE`` times one rank's bytes. Swap files
left by an earlier run (or written by a sibling rank that got here first) are truncated or
counted already, so the space they hold counts as available.
"""

from __future__ import annotations

import glob
import os
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ds.interfaces.errors import ConfigError
from ds.zero.stage3.shard import ShardState

SWAP_GLOB = "ds_zero3_*_rank*.swp"  # the names SwapFile gets in swap.py and optimizer.py


def _align(n: int, block: int) -> int:
    return -(-n // block) * block


@dataclass(frozen=True)
class SwapNeed:
    """One rank's bytes in one swap file: ``section`` is the config key that puts them there."""

    section: str
    path: str
    nbytes: int


def param_swap_bytes(
    states: Iterable[ShardState], max_in_cpu: int, persistence_threshold: int, align: int = 4096
) -> int:
    """Bytes of the parameter swap file: every shard of a parameter above the persistence
    threshold, in registration order, past the first ``max_in_cpu`` elements kept in memory (as
    ``Stage3Partitioner`` and ``ParamSwapper.register`` decide)."""
    in_cpu = total = 0
    for s in states:
        if s.numel <= persistence_threshold:
            continue
        if in_cpu + s.shard_numel <= max_in_cpu:
            in_cpu += s.shard_numel
            continue
        total += _align(s.shard_bytes, align)
    return total


def optimizer_swap_bytes(states: Iterable[ShardState], align: int = 4096) -> int:
    """Bytes of the optimizer swap file: an fp32 master and two fp32 moments per partition."""
    return sum(3 * _align(s.shard_numel * 4, align) for s in states)


def _existing(path: str) -> str:
    """``path`` or its nearest existing ancestor (the swap file's directory is made later)."""
    p = os.path.abspath(path)
    while not os.path.exists(p):
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    return p


def _held_by_swap_files(paths: Iterable[str]) -> int:
    """Bytes on disk of ds swap files already under ``paths`` (reused or truncated on open)."""
    files = {os.path.realpath(f) for p in paths for f in glob.glob(os.path.join(p, SWAP_GLOB))}
    total = 0
    for f in files:
        try:
            total += os.stat(f).st_blocks * 512
        except OSError:
            continue
    return total


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit} ({n:,} bytes)"
    return f"{n:,} bytes"


def stage3_needs(
    zero: Any, params: Sequence[ShardState], trained: Sequence[ShardState], threshold: int
) -> list[SwapNeed]:
    """One rank's swap bytes per section of ``zero`` (the ``zero_optimization`` config) that
    offloads to NVMe: ``params`` every partitioned parameter, ``trained`` those the optimizer
    steps. A missing ``nvme_path`` is left to the swap file's own error."""
    needs = []
    op, oo = zero.offload_param, zero.offload_optimizer
    if zero.offload_param_device == "nvme" and op is not None and op.nvme_path:
        max_in_cpu = int(op.max_in_cpu) if op.max_in_cpu < 1_000_000_000 else 0
        nbytes = param_swap_bytes(params, max_in_cpu, threshold)
        needs.append(SwapNeed("offload_param", str(op.nvme_path), nbytes))
    if zero.offload_optimizer_device == "nvme" and oo is not None and oo.nvme_path:
        needs.append(
            SwapNeed("offload_optimizer", str(oo.nvme_path), optimizer_swap_bytes(trained))
        )
    return needs


def ranks_per_node() -> int:
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def check_room(needs: Sequence[SwapNeed], local_ranks: int = 1) -> None:
    """Raise ``ConfigError`` when a filesystem lacks room for the swap files bound for it."""
    by_fs: dict[int, list[SwapNeed]] = {}
    for need in needs:
        if need.nbytes > 0:
            by_fs.setdefault(os.stat(_existing(need.path)).st_dev, []).append(need)
    for group in by_fs.values():
        paths = list(dict.fromkeys(n.path for n in group))
        needed = sum(n.nbytes for n in group) * local_ranks
        available = shutil.disk_usage(_existing(paths[0])).free + _held_by_swap_files(paths)
        if needed <= available:
            continue
        parts = " + ".join(f"{n.section} {_size(n.nbytes)}" for n in group)
        per = f" per rank x {local_ranks} ranks on this node" if local_ranks > 1 else ""
        keys = " / ".join(f"zero_optimization.{n.section}.nvme_path" for n in group)
        raise ConfigError(
            f"NVMe offload needs {_size(needed)} on {', '.join(paths)} ({parts}{per}) but only "
            f"{_size(available)} is available there; set {keys} to a directory with more room, "
            "or offload fewer states to NVMe (offload_param or offload_optimizer device 'cpu')"
        )
