"""AutoEP with DeepSpeed's block layout, as ``initialize`` applies it.

Each MoE block the model's family describes (:func:`~ds.parallel.moe.autoep_layer.detect_moe_layers`:
``expert_parallel.preset_model``, else transformers' ``config.model_type``) is replaced by an
:class:`~ds.parallel.moe.autoep_layer.AutoEPMoELayer` holding this rank's ``E / autoep_size``
experts, exactly what ``deepspeed.module_inject.auto_ep.AutoEP`` builds by hand.
:func:`autoep_layers_metadata` describes the replaced layers for a checkpoint (DeepSpeed's
``ds_autoep_layers`` entries, which ds's universal-checkpoint converter reads).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from .autoep_config import parse_autoep_config, validate_autoep_post_detection
from .autoep_layer import (
    AutoEPMoELayer,
    Gather,
    detect_moe_layers,
    replace_moe_layer,
)
from .groups import expert_groups


def replace_autoep_blocks(
    model: nn.Module, section: Mapping[str, Any], comm: Any, gather: Gather | None = None
) -> list[AutoEPMoELayer]:
    """Replace every MoE block of ``model`` by an AutoEPMoELayer over ``autoep_size`` ranks
    (collective: creates the expert groups); returns the new layers, empty when the model's
    family has no blocks. ``gather`` makes ZeRO-3 partitioned source weights whole while read."""
    config = parse_autoep_config({**section, "enabled": True})
    specs = detect_moe_layers(model, config)
    if not specs:
        return []
    validate_autoep_post_detection(config, specs)
    ep = int(config.autoep_size)
    ep_rank = expert_groups(comm, ep).ep_rank
    return [replace_moe_layer(model, spec, ep, ep_rank, config, gather) for spec in specs]


def autoep_layers_metadata(model: nn.Module) -> list[dict[str, Any]]:
    """One entry per AutoEPMoELayer of ``model``, in module order (the ``moe_layer_id``)."""
    entries = []
    for name, module in model.named_modules():
        if not isinstance(module, AutoEPMoELayer):
            continue
        prefix = f"{name}." if name else ""
        entries.append(
            {
                "moe_layer_id": len(entries),
                "module_path": name,
                "num_experts": int(module.num_experts),
                "num_local_experts": int(module.num_local_experts),
                "ep_size": int(module.ep_size),
                "ep_rank": int(module.ep_rank),
                "ep_group_name": module.ep_group_name,
                "expert_key_prefix": f"{prefix}experts",
            }
        )
    return entries


def checkpoint_objects(model: nn.Module) -> dict[str, Any]:
    """What a checkpoint of ``model`` records about its AutoEP layers
    (``ds.interfaces.moe.CHECKPOINT_OBJECTS_ATTR``)."""
    return {"ds_autoep_layers": autoep_layers_metadata(model)}


__all__ = ["autoep_layers_metadata", "checkpoint_objects", "replace_autoep_blocks"]
