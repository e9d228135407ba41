"""What DeepSpeed 0.19.8 reads without a strict model, read the same way before ds validates.

DeepSpeed builds pydantic models with ``extra="forbid"`` for some sections (``zero_optimization``,
``fp16``, ``bf16``, the monitors, ``comms_logger``, ``hybrid_engine``, ``compile``, ...) and reads
everything else with ``dict.get``: an unknown key at the top level or inside ``optimizer``,
``scheduler``, ``activation_checkpointing``, ``aio``, ``checkpoint``, ``flops_profiler``,
``data_types``, ``torch_autocast`` or ``timers`` is silently ignored there. ds ignores it too but
says so (one warning per load, with a did-you-mean), then validates the rest strictly.

DeepSpeed refuses some keys outright: features it removed (``nebula``, ``elasticity``, ...), whose
leftover blocks would otherwise silently do nothing. ds refuses the same keys with the reason.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ds.zero.config.suggest import closest

# Top-level and zero_optimization keys DeepSpeed 0.19.8 refuses: the feature was removed.
REMOVED_TOP_LEVEL: dict[str, str] = {
    "nebula": "Nebula checkpointing was removed from DeepSpeed; checkpoints are written by the "
    "configured checkpoint engine. Remove the 'nebula' block",
    "compression_training": "DeepSpeed's compression library was removed; a leftover block would "
    "train unquantized. Remove 'compression_training'",
    "amp": "NVIDIA Apex AMP support was removed; use 'bf16', 'fp16' or 'torch_autocast' instead",
    "quantize_training": "Mixture-of-Quantization ('quantize_training') was removed; remove it",
    "sparse_gradients": "sparse compression of dense embedding gradients was removed; remove "
    "'sparse_gradients' (gradients of sparse=True embeddings need no flag)",
    "eigenvalue": "the eigenvalue (MoQ) block was removed; remove 'eigenvalue'",
    "sparse_attention": "DeepSpeed Sparse Attention was removed; remove 'sparse_attention'",
    "elasticity": "elastic training was removed; set train_batch_size, "
    "train_micro_batch_size_per_gpu and gradient_accumulation_steps directly",
    "graph_harvesting": "graph harvesting was removed; remove 'graph_harvesting'",
    "curriculum_learning": "top-level 'curriculum_learning' was removed; use "
    "'data_efficiency.data_sampling.curriculum_learning'",
    "progressive_layer_drop": "Progressive Layer Dropping was removed; remove "
    "'progressive_layer_drop'",
}
REMOVED_ZERO: dict[str, str] = {
    "mics_shard_size": "MiCS sharding was removed; remove zero_optimization.mics_shard_size",
    "mics_hierarchical_params_gather": "MiCS sharding was removed; remove "
    "zero_optimization.mics_hierarchical_params_gather",
    "zeropp_loco_param": "LoCo-ZeRO++ was removed; remove zero_optimization.zeropp_loco_param "
    "(zero_quantized_gradients works without it)",
}

# Sections read key by key (path from the top): unknown keys in them are ignored with a warning.
LENIENT_SECTIONS: tuple[tuple[str, ...], ...] = (
    (),
    ("optimizer",),
    ("scheduler",),
    ("activation_checkpointing",),
    ("aio",),
    ("checkpoint",),
    ("checkpoint", "writer"),
    ("checkpoint", "parallel_write"),
    ("flops_profiler",),
    ("data_types",),
    ("torch_autocast",),
    ("timers",),
)


@dataclass
class Prepared:
    """The config as ds validates it, with what the lenient reading set aside."""

    data: dict[str, Any]
    ignored: list[str] = field(default_factory=list)  # warning lines, one per ignored key
    problems: list[str] = field(default_factory=list)  # error lines (removed features)


def prepare(data: dict[str, Any], known: Callable[[tuple[str, ...]], list[str]]) -> Prepared:
    """Apply DeepSpeed's lenient reading to ``data`` (copied). ``known(path)`` lists the keys
    ds's model has at ``path``."""
    out = Prepared(copy.deepcopy(data))
    cfg = out.data
    for key, why in REMOVED_TOP_LEVEL.items():
        if key in cfg:
            out.problems.append(f"{key}: no longer supported by DeepSpeed 0.19.8 or ds: {why}")
            del cfg[key]
    zero = cfg.get("zero_optimization")
    if isinstance(zero, bool):
        # DeepSpeed's oldest form: "zero_optimization": true means stage 1.
        stage = 1 if zero else 0
        cfg["zero_optimization"] = {"stage": stage}
        if stage and "allgather_size" in cfg:
            cfg["zero_optimization"]["allgather_bucket_size"] = cfg["allgather_size"]
        zero = cfg["zero_optimization"]
    if isinstance(zero, dict):
        for key, why in REMOVED_ZERO.items():
            if key in zero:
                out.problems.append(f"zero_optimization.{key}: no longer supported: {why}")
                del zero[key]
    for section in ("optimizer", "scheduler"):
        node = cfg.get(section)
        if isinstance(node, dict) and node.get("type") is None:
            # DeepSpeed builds no optimizer (scheduler) from a section without a type.
            out.ignored.append(
                f"{section}: the section has no 'type', so DeepSpeed and ds ignore all of it"
            )
            del cfg[section]
    for path in LENIENT_SECTIONS:
        node: Any = cfg
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            continue
        names = known(path)
        if not names:
            continue
        for key in [k for k in node if k not in names]:
            where = ".".join(path) or "the top level"
            dotted = ".".join((*path, key))
            out.ignored.append(f"{dotted} (unknown key in {where}{closest(key, names)})")
            del node[key]
    return out
