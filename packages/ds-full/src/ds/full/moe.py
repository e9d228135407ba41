"""Mixture-of-experts in ``ds.initialize``: bind the model's MoE layers to their expert groups.

A model containing ``ds.parallel.moe.MoE`` layers (or DeepSpeed's ``deepspeed.moe.layer.MoE``
from the shim) gets them bound here, before the engine is built: each layer joins its
expert-parallel and expert-data-parallel groups, takes its experts' global indices and marks
their parameters, so the engine reduces them over their own ranks. The ``expert_parallel``
section (``{"enabled": true, "autoep_size": N}``) turns on AutoEP for transformers' sparse MoE
blocks (:mod:`ds.parallel.moe.autoep`); layers made with DeepSpeed's AutoEP API
(``AutoEPMoELayer``) are bound to their expert groups too.
"""

from __future__ import annotations

from typing import Any

import torch

from ds.interfaces.errors import ConfigError


def _section(cfg: Any) -> dict[str, Any] | None:
    expert = cfg.expert_parallel
    if isinstance(expert, dict) and expert and expert.get("enabled", True):
        return expert
    return None


def prepare(cfg: Any, communicator: Any, model: torch.nn.Module, mesh: Any) -> list[Any]:
    """Bind every MoE layer of ``model`` (AutoEP first when the config asks for it); returns
    the layers. Collective: every rank calls it with the same model and config."""
    from ds.parallel.moe import moe_layers

    section = _section(cfg)
    comm = communicator if communicator.is_initialized() else None
    auto = int(section.get("autoep_size", 0) or 0) if section else 0
    blocks: list[Any] = []
    if auto:
        from ds.parallel.moe import expert_layout
        from ds.parallel.moe.autoep import autoep

        expert_layout(int(comm.get_world_size()) if comm is not None else 1, auto)  # divides?

        blocks = autoep(model, comm, auto)
        if blocks:
            from ds.interfaces.moe import EXPORT_ATTR
            from ds.parallel.moe.autoep import fused_state_dict

            # save_16bit_model writes transformers' fused expert tensors (from_pretrained loads).
            setattr(model, EXPORT_ATTR, fused_state_dict)
    from ds.parallel.moe.autoep_layer import iter_autoep_layers

    # Layers made with DeepSpeed's AutoEP API (deepspeed.module_inject.auto_ep) before initialize.
    for layer in iter_autoep_layers(model):
        if layer.ep_size > 1:
            # Every rank's stacked experts carry the same names (experts.w1, ...): checkpoints
            # and the 16-bit export, which key parameters by name, would keep one rank's.
            raise ConfigError(
                f"an AutoEPMoELayer with ep_size={layer.ep_size} (DeepSpeed's AutoEP API) under "
                "ds.initialize: its experts cannot be saved whole; leave the model's MoE blocks "
                "as they are and set expert_parallel.autoep_size (ds's AutoEP names experts by "
                "global index), or build the layers with ep_size=1"
            )
        layer.bind(comm)
        blocks.append(layer)
    layers = moe_layers(model)
    if section is not None and not layers and not blocks:
        raise ConfigError(
            "expert_parallel is set but the model has no MoE layers (ds.parallel.moe.MoE / "
            "deepspeed.moe.layer.MoE, or a Mixtral / Qwen2-MoE / Qwen3-MoE sparse block for "
            "autoep_size); remove the expert_parallel section or add MoE layers"
        )
    if (layers or blocks) and mesh is not None:
        s = mesh.shape
        raise ConfigError(
            f"mixture-of-experts on a mesh of tp={s.tp}, sp={s.sp}, pp={getattr(s, 'pp', 1)}: "
            "expert parallelism composes only with data parallelism in ds yet; set "
            "tensor_parallel.autotp_size, sequence_parallel_size and pipeline stages to 1"
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
