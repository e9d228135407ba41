"""Expert parallelism folded onto tensor parallelism in ``ds.initialize``.

With ``tensor_parallel.autotp_size`` T > 1 and ``expert_parallel.autoep_size`` E > 1, the world's
ranks form T-rank tensor-parallel groups (consecutive ranks) and, independently, E-rank
expert-parallel groups (consecutive ranks: one may span several TP groups); the TP ranks of a
group share the routes of their identical tokens (:mod:`ds.parallel.moe.folded`). This module
checks the combination against the folded layout's rules, before any layer is touched, and
builds each rank's :class:`~ds.parallel.moe.folding.FoldingGroupHandles` from the mesh's TP
and data-parallel groups and the expert groups.
"""

from __future__ import annotations

from typing import Any

from ds.interfaces.errors import ConfigError


def handles(cfg: Any, comm: Any, mesh: Any, ep_size: int) -> Any:
    """This rank's folding groups, or None when no tensor-parallel mesh is in use. Refuses
    layouts the folded runtime does not run (ConfigError naming the setting to change)."""
    if mesh is None or mesh.shape.tp == 1:
        return None
    from ds.parallel.moe.folding import (
        FoldingGroupHandles,
        build_folding_spec,
        expected_folding_group_tables,
        validate_folding_global,
    )
    from ds.parallel.moe.groups import expert_groups

    shape, zero = mesh.shape, cfg.zero_optimization
    world = int(comm.get_world_size()) if comm is not None else 1
    try:
        spec = build_folding_spec(
            world_size=world, pp_size=shape.pp, tp_size=shape.tp, ep_size=max(ep_size, 1)
        )
        validate_folding_global(
            spec,
            zero_stage=int(zero.stage),
            sp_size=shape.sp,
            zero_offload_optimizer=zero.offload_optimizer_device in ("cpu", "nvme"),
            zero_offload_param=zero.offload_param_device in ("cpu", "nvme"),
        )
    except ValueError as err:
        raise ConfigError(f"expert_parallel with tensor_parallel: {err}") from err
    groups = expert_groups(comm, spec.ep_size)
    tables = expected_folding_group_tables(spec)
    tp_ranks, dp_ranks = tuple(mesh.ranks("tp")), tuple(mesh.ranks("dp"))
    if tp_ranks not in tables.tp_groups or groups.ep_ranks not in tables.ep_groups:
        raise ConfigError(  # the mesh and the expert groups are built by ds: a layout bug
            f"the tensor-parallel group {tp_ranks} and expert group {groups.ep_ranks} do not "
            f"form the folded layout {tables}"
        )
    return FoldingGroupHandles(
        spec=spec,
        tp_group=mesh.group("tp"),
        dense_dp_group=mesh.group("dp"),
        ep_group=groups.ep_group,
        edp_group=groups.replicas.group,
        ep_group_name=groups.name,
        tp_ranks=tp_ranks,
        dense_dp_ranks=dp_ranks,
        ep_ranks=groups.ep_ranks,
        edp_ranks=groups.replicas.ranks,
    )


def fold_experts(blocks: list[Any], comm: Any, found: Any) -> None:
    """Give ds's per-expert AutoEP modules their share of the routes on each TP rank."""
    from ds.parallel.moe.folded import TPFold

    rank = int(comm.get_rank())
    for block in blocks:
        block.fold = TPFold(comm, found.tp_group, found.tp_ranks.index(rank), found.spec.tp_size)


__all__ = ["fold_experts", "handles"]
