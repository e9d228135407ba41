"""Elastic batch sizes: one global batch size that many GPU counts can train with unchanged.

A global batch ``B`` splits as ``micro_batch * gradient_accumulation * world``; a job can move
between world sizes without changing its convergence when ``B`` stays fixed. Given the micro
batches a model fits and the largest batch it tolerates, ``compute_elastic_config`` picks the
``B`` (at most ``max_train_batch_size``) that the most GPU counts in ``[min_gpus, max_gpus]``
divide with a whole number of some micro batch per GPU, and lists those GPU counts.

Candidates for ``B`` are each micro batch (and their least common multiple) scaled by the
largest highly composite number that keeps ``B`` within the limit: highly composite multipliers
have the most divisors, hence the most valid world sizes. Version 0.2 works per node (whole
nodes of ``num_gpus_per_node``, model parallel groups of ``model_parallel_size`` inside a node)
and, for a world outside the valid list, falls back to the largest batch that world can run.

DeepSpeed 0.19.8 refuses an ``elasticity`` section in a training config (elastic training was
removed from its engine) and so does ds; this computation is what schedulers and launch scripts
call to plan such jobs.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from packaging import version as pkg_version

from ds.full.compat.deepspeed.elasticity import constants as C
from ds.full.compat.deepspeed.elasticity.config import (
    ElasticityConfig,
    ElasticityConfigError,
    ElasticityError,
    ElasticityIncompatibleWorldSize,
)

# The highly composite numbers (OEIS A002182) up to 720720: each has more divisors than any
# smaller positive integer.
HCN_LIST = [
    1, 2, 4, 6, 12, 24, 36, 48, 60, 120, 180, 240, 360, 720, 840, 1260, 1680, 2520, 5040, 7560,
    10080, 15120, 20160, 25200, 27720, 45360, 50400, 55440, 83160, 110880, 166320, 221760, 277200,
    332640, 498960, 554400, 665280, 720720,
]  # fmt: skip


def _largest_hcn_at_most(value: int) -> int:
    return max(h for h in HCN_LIST if h <= max(value, 1))


def get_candidate_batch_sizes(base_list: list[int], max_acceptable_batch_size: int) -> list[int]:
    """Each base scaled by the largest highly composite number keeping it within the limit."""
    out = set()
    for base in base_list:
        if base > max_acceptable_batch_size:
            continue
        out.add(base * _largest_hcn_at_most(max_acceptable_batch_size // base))
    return sorted(out)


def get_valid_gpus(
    batch_size: int, micro_batches: list[int], min_valid_gpus: int, max_valid_gpus: int
) -> list[int]:
    """GPU counts in range that split ``batch_size`` into whole micro batches of some size."""
    valid = set()
    for micro in micro_batches:
        if batch_size % micro:
            continue
        per_micro = batch_size // micro  # GPUs x accumulation steps
        valid.update(
            g for g in range(min_valid_gpus, min(per_micro, max_valid_gpus) + 1)
            if per_micro % g == 0
        )  # fmt: skip
    return sorted(valid)


def get_best_candidates(
    candidate_batch_sizes: list[int], micro_batches: list[int], min_gpus: int, max_gpus: int,
    prefer_larger: bool,
) -> tuple[int, list[int] | None]:  # fmt: skip
    """The candidate valid for the most GPU counts; ties go to the larger batch (or the smaller
    one with ``prefer_larger=False``)."""
    best_size, best_gpus, best_count = min(micro_batches), None, 0
    for size in candidate_batch_sizes:
        gpus = get_valid_gpus(size, micro_batches, min_gpus, max_gpus)
        tie_wins = size > best_size if prefer_larger else size < best_size
        if len(gpus) > best_count or (len(gpus) == best_count and tie_wins):
            best_size, best_gpus, best_count = size, gpus, len(gpus)
    return best_size, best_gpus


def _compatible_gpus_v01(
    micro_batches: list[int], max_batch: int, min_gpus: int | None, max_gpus: int | None,
    prefer_larger: bool,
) -> tuple[int, list[int] | None]:  # fmt: skip
    lo = min_gpus or 1
    hi = max_gpus or max_batch // min(micro_batches)
    too_big = [m for m in micro_batches if m > max_batch]
    if too_big:
        raise ElasticityConfigError(
            f"elasticity.micro_batch_sizes {too_big} exceed max_train_batch_size {max_batch}; "
            "lower them or raise the maximum"
        )
    bases = [*micro_batches, math.lcm(*micro_batches)]
    candidates = get_candidate_batch_sizes(bases, max_batch)
    return get_best_candidates(candidates, micro_batches, lo, hi, prefer_larger)


def _micro_for(batch: float, world: int, micro_batches: list[int], prefer_larger: bool) -> Any:
    """The micro batch dividing each GPU's share (the largest, or the first listed)."""
    fitting = [m for m in micro_batches if batch // world % m == 0]
    if not fitting:
        return None
    return max(fitting) if prefer_larger else fitting[0]


def _compatible_gpus_v02(
    cfg: ElasticityConfig, current_num_gpus: int
) -> tuple[float, list[int], Any]:
    per_node, mp = cfg.num_gpus_per_node, cfg.model_parallel_size
    if per_node % mp:
        raise ElasticityError(
            f"elasticity version 0.2: num_gpus_per_node ({per_node}) must be divisible by "
            f"model_parallel_size ({mp})"
        )
    dp_per_node = per_node // mp
    node_batch, valid_nodes = _compatible_gpus_v01(
        cfg.micro_batches, int(cfg.max_acceptable_batch_size / dp_per_node),
        int(cfg.min_gpus / per_node), int(cfg.max_gpus / per_node), cfg.prefer_larger_batch_size,
    )  # fmt: skip
    batch = int(node_batch) * dp_per_node
    valid_dp = [n * dp_per_node for n in valid_nodes or []]
    prefer = cfg.prefer_larger_batch_size
    if current_num_gpus // mp in valid_dp:
        return batch, valid_dp, _micro_for(batch, current_num_gpus, cfg.micro_batches, prefer)
    # This world is not in the list: the largest (or smallest) batch it can run within the limit.
    dp = current_num_gpus / per_node * dp_per_node
    sizes = [
        math.floor(cfg.max_acceptable_batch_size / float(m * dp)) * m * dp
        for m in cfg.micro_batches
    ]
    fallback = max(sizes) if prefer else min(sizes)
    return fallback, [int(dp)], _micro_for(fallback, current_num_gpus, cfg.micro_batches, prefer)


def elasticity_enabled(ds_config: dict[str, Any]) -> bool:
    section = ds_config.get(C.ELASTICITY)
    return bool(section and section.get(C.ENABLED, C.ENABLED_DEFAULT))


def ensure_immutable_elastic_config(runtime_elastic_config_dict: dict[str, Any]) -> None:
    """Refuse a runtime elastic section that differs from the one the scheduler planned with
    (``DEEPSPEED_ELASTICITY_CONFIG``); without that variable there is nothing to compare."""
    planned = os.environ.get(C.DEEPSPEED_ELASTICITY_CONFIG)
    if planned is None:
        return
    seen, used = (
        ElasticityConfig(json.loads(planned)),
        ElasticityConfig(runtime_elastic_config_dict),
    )
    for attr, key in (
        ("max_acceptable_batch_size", C.MAX_ACCEPTABLE_BATCH_SIZE),
        ("micro_batches", C.MICRO_BATCHES),
        ("version", C.VERSION),
    ):
        if getattr(seen, attr) != getattr(used, attr):
            raise ElasticityConfigError(
                f"elasticity.{key} is {getattr(used, attr)!r} here but the resource scheduler "
                f"planned with {getattr(seen, attr)!r}; run with the config it saw"
            )


def _world_from_env() -> int:
    value = os.environ.get("WORLD_SIZE", "")
    if not value.isnumeric():
        raise ElasticityConfigError(
            "elasticity version 0.2 needs the world size: pass world_size= to "
            f"compute_elastic_config or set WORLD_SIZE (now {value or 'unset'})"
        )
    return int(value)


def compute_elastic_config(
    ds_config: dict[str, Any], target_deepspeed_version: str, world_size: int = 0,
    return_microbatch: bool = False,
) -> tuple[Any, ...]:  # fmt: skip
    """``(batch, valid_gpus)``, or ``(batch, valid_gpus, micro_batch)`` when ``world_size`` is
    given (it must be a valid count) or ``return_microbatch`` is set. Deterministic for a given
    config, so a scheduler and the job compute the same answer."""
    if not isinstance(ds_config, dict):
        raise ElasticityConfigError(
            f"compute_elastic_config expects the config as a dict, got {type(ds_config).__name__}"
        )
    if C.ELASTICITY not in ds_config:
        raise ElasticityConfigError("the config has no 'elasticity' section; add one")
    section = ds_config[C.ELASTICITY]
    if not section.get(C.ENABLED, C.ENABLED_DEFAULT):
        raise ElasticityConfigError("elasticity.enabled is false; set it to true")
    cfg = ElasticityConfig(section)
    ver = float(cfg.version)
    if cfg.model_parallel_size > 1 and ver != 0.2:
        raise ElasticityConfigError(
            f"elasticity version {cfg.version} has no model parallelism "
            f"(model_parallel_size={cfg.model_parallel_size}); use version 0.2"
        )
    if ver > C.LATEST_ELASTICITY_VERSION or ver not in (0.1, 0.2):
        raise ElasticityConfigError(
            f"elasticity.version {cfg.version} is not known; use 0.1 or 0.2"
        )
    if pkg_version.parse(target_deepspeed_version) < pkg_version.parse(C.MINIMUM_DEEPSPEED_VERSION):
        raise ElasticityError(
            f"target DeepSpeed version {target_deepspeed_version} predates elasticity "
            f"(needs >= {C.MINIMUM_DEEPSPEED_VERSION})"
        )
    micro = None
    if ver == 0.1:
        batch, valid = _compatible_gpus_v01(
            cfg.micro_batches, cfg.max_acceptable_batch_size, cfg.min_gpus, cfg.max_gpus,
            cfg.prefer_larger_batch_size,
        )  # fmt: skip
    else:
        current = world_size if world_size != 0 else _world_from_env()
        batch, valid, micro = _compatible_gpus_v02(cfg, current)
    batch, valid = int(batch), list(valid or [])
    if not valid or batch < 1:
        raise ElasticityError(
            f"no GPU count in [{cfg.min_gpus}, {cfg.max_gpus}] can train a batch of at most "
            f"{cfg.max_acceptable_batch_size} in micro batches of {cfg.micro_batches}; widen the "
            "GPU range, raise max_train_batch_size or add smaller micro batch sizes"
        )
    if world_size > 0:
        if world_size not in valid:
            raise ElasticityIncompatibleWorldSize(
                f"world size {world_size} is not one of the valid GPU counts {valid} for "
                f"batch size {batch}"
            )
        return batch, valid, _largest_micro(batch, world_size, cfg.micro_batches)
    if return_microbatch:
        if ver == 0.2:
            return batch, valid, micro
        raise ElasticityConfigError(
            "return_microbatch=True with elasticity version 0.1 needs world_size= (the micro "
            "batch depends on it)"
        )
    return batch, valid


def _largest_micro(batch: int, world: int, micro_batches: list[int]) -> int:
    for m in sorted(set(micro_batches), reverse=True):
        if batch // world % m == 0:
            return m
    raise ElasticityError(
        f"no micro batch in {micro_batches} divides {batch // world} samples per GPU"
    )


__all__ = [
    "HCN_LIST",
    "compute_elastic_config",
    "elasticity_enabled",
    "ensure_immutable_elastic_config",
]
