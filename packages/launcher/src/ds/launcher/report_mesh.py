"""``ds report --config``: the device mesh a job with this config gets (tensor x sequence x data
parallel groups), from the config's sizes and the world size; inside a launched job (``RANK`` and
``WORLD_SIZE`` set) it also names this rank's groups."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ds.interfaces.errors import ConfigError
from ds.interfaces.parallel import MeshShape


def _size(value: Any, name: str) -> int:
    if value in (None, "auto"):
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    return value


def mesh_report(config_path: str, world_size: int | None = None) -> dict[str, Any]:
    cfg = json.loads(Path(config_path).read_text())
    tp_section = cfg.get("tensor_parallel") or {}
    nested = tp_section.get("tp") if isinstance(tp_section.get("tp"), dict) else {}
    tp = _size(
        tp_section.get("autotp_size") or nested.get("tp_size"), "tensor_parallel.autotp_size"
    )
    sp = _size(cfg.get("sequence_parallel_size"), "sequence_parallel_size")
    world = world_size or int(os.environ.get("WORLD_SIZE", "0")) or tp * sp
    if world % (tp * sp):
        raise ConfigError(
            f"autotp_size {tp} x sequence_parallel_size {sp} = {tp * sp} does not divide the "
            f"world size {world}; choose sizes whose product divides it"
        )
    shape = MeshShape(dp=world // (tp * sp), sp=sp, tp=tp)
    out: dict[str, Any] = {
        "world_size": world,
        "sizes": {"dp": shape.dp, "sp": shape.sp, "tp": shape.tp},
        "groups": {
            dim: [list(g) for g in shape.groups(dim)] for dim in ("tp", "sp", "dp", "dp_sp")
        },
    }
    rank = os.environ.get("RANK")
    if rank is not None and int(rank) < world:
        r = int(rank)
        out["this rank"] = {
            "rank": r,
            **{
                dim: next(list(g) for g in shape.groups(dim) if r in g)
                for dim in ("tp", "sp", "dp", "dp_sp")
            },
        }
    return out


__all__ = ["mesh_report"]
