"""Mixture-of-experts in ``ds.initialize``: bind the model's MoE layers to their expert groups.

A model containing ``ds.parallel.moe.MoE`` layers (or DeepSpeed's ``deepspeed.moe.layer.MoE``
from the shim) gets them bound here, before the engine is built: each layer joins its
expert-parallel and expert-data-parallel groups, takes its experts' global indices and marks
their parameters, so the engine reduces them over their own ranks. The ``expert_parallel``
section (``{"enabled": true, "autoep_size": N}``) turns on AutoEP; layers made with DeepSpeed's
AutoEP API (``AutoEPMoELayer``) before ``initialize`` are bound to their expert groups too.

Which AutoEP a model gets (one rule, by what its MoE blocks are made of):

* blocks whose ``experts`` is transformers' fused experts module (``gate_up_proj``/``down_proj``
  tensors and an ``act_fn``: Mixtral, Qwen2-MoE, Qwen3-MoE) keep their router and get ds's
  per-expert module (:mod:`ds.parallel.moe.autoep`), which names each expert by its global index
  and so checkpoints whole at any ``autoep_size``;
* otherwise the model's family (``expert_parallel.preset_model``, else its
  ``config.model_type``) describes its blocks, and each is replaced by DeepSpeed's
  ``AutoEPMoELayer`` (:mod:`ds.parallel.moe.autoep_blocks`, the layout of
  ``deepspeed.module_inject.auto_ep``). Each rank's experts are stacked under one name, marked
  as its rows of the ``[E, ...]`` tensor (``ds.interfaces.moe.ExpertSlice``) so that
  checkpoints hold every expert;
* a model with neither is an error, as is one whose family names no blocks.

With ``tensor_parallel.autotp_size`` > 1 as well, expert parallelism folds onto tensor
parallelism (:mod:`ds.full.moe_folding`): the TP ranks of a group share their tokens' routes.
"""

from __future__ import annotations

from typing import Any

import torch

from ds.full import moe_folding
from ds.interfaces.errors import ConfigError


def _section(cfg: Any) -> dict[str, Any] | None:
    expert = cfg.expert_parallel
    if isinstance(expert, dict) and expert and expert.get("enabled", True):
        return expert
    return None


def _names_a_family(section: dict[str, Any], model: torch.nn.Module) -> bool:
    return bool(
        section.get("preset_model") or getattr(getattr(model, "config", None), "model_type", None)
    )


def _replace_blocks(section: dict[str, Any], comm: Any, model: torch.nn.Module, auto: int) -> None:
    """DeepSpeed's AutoEP layout (see the module docstring); the layers are bound below."""
    from ds.parallel.moe.autoep_blocks import replace_autoep_blocks
    from ds.zero.init import GatheredParameters

    def gather(params: list[torch.nn.Parameter]) -> Any:
        return GatheredParameters(params, modifier_rank=None)

    try:
        replace_autoep_blocks(model, section, comm, gather)
    except ValueError as err:
        raise ConfigError(f"expert_parallel: {err}") from err


def prepare(cfg: Any, communicator: Any, model: torch.nn.Module, mesh: Any) -> list[Any]:
    """Bind every MoE layer of ``model`` (AutoEP first when the config asks for it); returns
    the layers. Collective: every rank calls it with the same model and config."""
    from ds.parallel.moe import moe_layers

    section = _section(cfg)
    comm = communicator if communicator.is_initialized() else None
    auto = int(section.get("autoep_size", 0) or 0) if section else 0
    blocks: list[Any] = []
    folding = moe_folding.handles(cfg, comm, mesh, auto) if (auto or section) else None
    if auto:
        from ds.parallel.moe import expert_layout
        from ds.parallel.moe.autoep import autoep

        expert_layout(int(comm.get_world_size()) if comm is not None else 1, auto)  # divides?

        blocks = autoep(model, comm, auto)
        if folding is not None:
            moe_folding.fold_experts(blocks, comm, folding)
        if blocks:
            from ds.interfaces.moe import EXPORT_ATTR
            from ds.parallel.moe.autoep import fused_state_dict

            # save_16bit_model writes transformers' fused expert tensors (from_pretrained loads).
            setattr(model, EXPORT_ATTR, fused_state_dict)
        elif section is not None and _names_a_family(section, model):
            _replace_blocks(section, comm, model, auto)
    from ds.parallel.moe.autoep_layer import iter_autoep_layers

    # Layers made with DeepSpeed's AutoEP API (deepspeed.module_inject.auto_ep) before initialize.
    for layer in iter_autoep_layers(model):
        if folding is not None:
            layer.bind_folded(comm, folding)
        else:
            layer.bind(comm)
        blocks.append(layer)
    if any(True for _ in iter_autoep_layers(model)):
        from ds.interfaces.moe import CHECKPOINT_OBJECTS_ATTR
        from ds.parallel.moe.autoep_blocks import checkpoint_objects

        # Checkpoints record the layers' layout (ds_autoep_layers, read by universal conversion).
        setattr(model, CHECKPOINT_OBJECTS_ATTR, checkpoint_objects)
    layers = moe_layers(model)
    if section is not None and not layers and not blocks:
        raise ConfigError(
            "expert_parallel is set but the model has no MoE layers (ds.parallel.moe.MoE / "
            "deepspeed.moe.layer.MoE, or a Mixtral / Qwen2-MoE / Qwen3-MoE sparse block for "
            "autoep_size); remove the expert_parallel section or add MoE layers"
        )
    if (layers or (blocks and folding is None)) and mesh is not None:
        s = mesh.shape
        what = "MoE layers (ds.parallel.moe.MoE / deepspeed.moe.layer.MoE)" if layers else "AutoEP"
        raise ConfigError(
            f"{what} on a mesh of tp={s.tp}, sp={s.sp}, pp={getattr(s, 'pp', 1)}: these "
            "compose only with data parallelism in ds; AutoEP (expert_parallel.autoep_size > 1) "
            "folds onto tensor parallelism; set sequence_parallel_size and pipeline stages to 1"
        )
    for layer in layers:
        if auto and layer.ep_size != auto:
            raise ConfigError(
                f"a MoE layer has ep_size={layer.ep_size} but expert_parallel.autoep_size="
                f"{auto}; make them agree (autoep_size applies to transformers' MoE blocks)"
            )
        layer.bind(comm)
    return layers + blocks


__all__ = ["prepare"]
