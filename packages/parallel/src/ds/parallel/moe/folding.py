"""The rank layout of expert parallelism folded onto tensor parallelism (pure arithmetic).

Within each pipeline stage of ``stage_size = world / pp`` consecutive ranks:

* TP groups are consecutive blocks of ``tp`` ranks; dense data parallelism (``dp = stage / tp``)
  joins the ranks at the same position of every TP group (strided by ``tp``).
* EP groups are consecutive blocks of ``ep * etp`` ranks, laid over the stage independently of
  the TP groups (an EP group may span several TP groups, so a node-contiguous rank order keeps
  it inside a node); expert data parallelism (``edp = stage / (ep * etp)``) joins the ranks at
  the same position of every EP group.

Nothing here creates a process group; :class:`FoldingGroupHandles` carries the ones a caller
created from these tables.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

Groups = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class ParallelFoldingSpec:
    world_size: int
    pp_size: int
    stage_size: int
    tp_size: int
    dp_size: int
    ep_size: int
    etp_size: int
    edp_size: int
    mp_mode: str = "tp"


@dataclass(frozen=True)
class FoldingGroupTables:
    tp_groups: Groups
    dense_dp_groups: Groups
    ep_groups: Groups
    edp_groups: Groups


@dataclass(frozen=True)
class FoldingGroupHandles:
    """The process groups one rank belongs to, with their rank lists."""

    spec: ParallelFoldingSpec
    tp_group: Any
    dense_dp_group: Any
    ep_group: Any
    edp_group: Any
    ep_group_name: str
    tp_ranks: tuple[int, ...]
    dense_dp_ranks: tuple[int, ...]
    ep_ranks: tuple[int, ...]
    edp_ranks: tuple[int, ...]


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def build_folding_spec(
    *,
    world_size: int,
    pp_size: int,
    tp_size: int,
    ep_size: int,
    etp_size: int = 1,
    mp_mode: str = "tp",
) -> ParallelFoldingSpec:
    """The sizes of every axis; ValueError naming the valid values when one does not divide."""
    for key, value in (
        ("world_size", world_size),
        ("pp_size", pp_size),
        ("tensor_parallel.autotp_size", tp_size),
        ("expert_parallel.autoep_size", ep_size),
        ("expert_parallel.expert_tensor_parallel_size", etp_size),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{key} must be a positive integer, got {value!r}")
    if world_size % pp_size:
        raise ValueError(
            f"pp_size={pp_size} must divide world_size={world_size}. "
            f"Valid pp_size values: {divisors(world_size)}"
        )
    stage = world_size // pp_size
    where = f"the stage size (world_size={world_size} / pp_size={pp_size} = {stage})"
    if stage % tp_size:
        raise ValueError(
            f"tensor_parallel.autotp_size={tp_size} must divide {where}, or dense data "
            f"parallelism is not whole. Valid autotp_size values: {divisors(stage)}"
        )
    width = ep_size * etp_size
    if stage % width:
        raise ValueError(
            "expert_parallel.autoep_size * expert_parallel.expert_tensor_parallel_size "
            f"({ep_size} * {etp_size} = {width}) must divide {where}, or expert data parallelism "
            f"is not whole. Valid expert-width values: {divisors(stage)}"
        )
    return ParallelFoldingSpec(
        world_size=world_size,
        pp_size=pp_size,
        stage_size=stage,
        tp_size=tp_size,
        dp_size=stage // tp_size,
        ep_size=ep_size,
        etp_size=etp_size,
        edp_size=stage // width,
        mp_mode=mp_mode,
    )


def expected_folding_group_tables(spec: ParallelFoldingSpec) -> FoldingGroupTables:
    tp: list[tuple[int, ...]] = []
    dp: list[tuple[int, ...]] = []
    ep: list[tuple[int, ...]] = []
    edp: list[tuple[int, ...]] = []
    width = spec.ep_size * spec.etp_size
    for first in range(0, spec.world_size, spec.stage_size):
        ranks = tuple(range(first, first + spec.stage_size))
        tp += [ranks[i : i + spec.tp_size] for i in range(0, spec.stage_size, spec.tp_size)]
        dp += [ranks[lane :: spec.tp_size] for lane in range(spec.tp_size)]
        blocks = [ranks[i : i + width] for i in range(0, spec.stage_size, width)]
        ep += blocks
        edp += [tuple(b[pos] for b in blocks) for pos in range(width)]
    return FoldingGroupTables(tuple(tp), tuple(dp), tuple(ep), tuple(edp))


def local_folding_ranks(global_rank: int, spec: ParallelFoldingSpec) -> dict[str, tuple[int, ...]]:
    """The rank list of each of ``global_rank``'s groups: ``tp``, ``dense_dp``, ``ep``, ``edp``."""
    t = expected_folding_group_tables(spec)
    tables = {"tp": t.tp_groups, "dense_dp": t.dense_dp_groups, "ep": t.ep_groups}
    tables["edp"] = t.edp_groups
    return {k: next(g for g in groups if global_rank in g) for k, groups in tables.items()}


def _mpu_size(mpu: Any, *getters: str) -> int | None:
    for name in getters:
        fn = getattr(mpu, name, None) if mpu is not None else None
        if fn is not None:
            return int(fn())
    return None


def validate_folding_global(
    spec: ParallelFoldingSpec,
    *,
    zero_stage: int = 0,
    sp_size: int = 1,
    deepcompile_enabled: bool = False,
    use_data_before_expert_parallel: bool = False,
    mpu: Any = None,
    autoep_enabled: bool = True,
    tp_preset: str | None = None,
    ep_preset: str | None = None,
    zero_offload_optimizer: bool = False,
    zero_offload_param: bool = False,
) -> None:
    """Refuse the combinations the folded layout does not support, before any group exists."""
    if not autoep_enabled:
        return
    folded = spec.tp_size > 1
    if deepcompile_enabled and folded:
        raise ValueError(
            "DeepCompile with AutoEP+AutoTP folding is not supported; disable compile.deepcompile "
            "or use AutoEP without tensor parallelism (tensor_parallel.autotp_size=1)"
        )
    if folded and spec.pp_size > 1:
        raise ValueError(
            f"AutoEP+AutoTP folding supports pp_size=1 only; got pp_size={spec.pp_size}"
        )
    if folded and sp_size > 1:
        raise ValueError(
            "tensor_parallel.autotp_size and Ulysses sequence parallelism are mutually exclusive "
            f"with AutoEP (autotp_size={spec.tp_size}, sp_size={sp_size})"
        )
    if spec.etp_size != 1:
        raise ValueError(
            f"expert_parallel.expert_tensor_parallel_size={spec.etp_size} is reserved for "
            "tensor parallelism inside experts, which is not supported; use "
            "expert_tensor_parallel_size=1"
        )
    if tp_preset is not None and ep_preset is not None and tp_preset != ep_preset:
        raise ValueError(
            "tensor_parallel.preset_model and expert_parallel.preset_model must match when both "
            f"are set (got {tp_preset!r} and {ep_preset!r})"
        )
    if folded and spec.ep_size == 1:
        raise ValueError(
            "AutoEP+AutoTP folding requires expert_parallel.autoep_size > 1: with one expert "
            "rank every TP rank would compute, and count the gradient of, the same routed tokens"
        )
    if folded and use_data_before_expert_parallel:
        raise ValueError(
            "use_data_before_expert_parallel_ is not supported with AutoEP+AutoTP folding; "
            "disable it"
        )
    if folded and (zero_offload_optimizer or zero_offload_param):
        raise ValueError(
            "ZeRO optimizer/parameter offload is not supported with AutoEP+AutoTP folding; "
            "disable offload or tensor parallelism"
        )
    if folded and zero_stage == 3:
        raise ValueError(
            "ZeRO stage 3 with AutoEP+AutoTP folding belongs to a separate ZeRO-3 composition "
            "lane that is not supported; use ZeRO stage 0, 1 or 2"
        )
    mpu_tp = _mpu_size(mpu, "get_tensor_model_parallel_world_size", "get_model_parallel_world_size")
    if mpu_tp not in (None, 1, spec.tp_size):
        raise ValueError(
            f"mpu tensor/model parallel world size ({mpu_tp}) conflicts with "
            f"tensor_parallel.autotp_size={spec.tp_size}"
        )
    mpu_pp = _mpu_size(
        mpu, "get_pipeline_model_parallel_world_size", "get_pipeline_parallel_world_size"
    )
    if mpu_pp not in (None, spec.pp_size):
        raise ValueError(
            f"mpu pipeline parallel world size ({mpu_pp}) conflicts with pp_size={spec.pp_size}"
        )


def assert_group_matches_spec(
    existing_rank_lists: Mapping[str, Iterable[Iterable[int]]]
    | tuple[Iterable[Iterable[int]], Iterable[Iterable[int]]],
    spec: ParallelFoldingSpec,
    *,
    group_kind: str = "ep_edp",
) -> None:
    """RuntimeError when expert (``ep``) or expert-data (``edp``) rank lists created earlier
    are not groups of ``spec``'s layout (a stale cache from another layout)."""
    tables = expected_folding_group_tables(spec)
    if isinstance(existing_rank_lists, Mapping):
        seen_ep, seen_edp = existing_rank_lists.get("ep", ()), existing_rank_lists.get("edp", ())
    else:
        seen_ep, seen_edp = existing_rank_lists
    for what, seen, allowed in (
        ("expert-parallel", seen_ep, tables.ep_groups),
        ("expert-data-parallel", seen_edp, tables.edp_groups),
    ):
        for group in seen:
            ranks = tuple(int(r) for r in group)
            if ranks not in allowed:
                raise RuntimeError(
                    f"{what} group {ranks} created earlier does not match folding spec {spec}"
                )


__all__ = [
    "FoldingGroupHandles",
    "FoldingGroupTables",
    "ParallelFoldingSpec",
    "assert_group_matches_spec",
    "build_folding_spec",
    "divisors",
    "expected_folding_group_tables",
    "local_folding_ranks",
    "validate_folding_global",
]
