"""``deepspeed.module_inject.auto_ep``: ``AutoEP`` finds a model's MoE blocks and replaces them with
``AutoEPMoELayer`` (:mod:`ds.parallel.moe.autoep_layer`); ``_resolve_route_scale`` is the router
scale it applies (:func:`ds.parallel.moe.token_choice.resolve_route_scale`)."""

from __future__ import annotations

from typing import Any

from torch import nn

from ds.full.compat.deepspeed.moe import ep_repack
from ds.parallel.moe.autoep_config import AutoEPConfig, MoELayerSpec
from ds.parallel.moe.autoep_layer import (
    AutoEPMoELayer,
    detect_moe_layers,
    replace_moe_layer,
    resolve_family,
)
from ds.parallel.moe.token_choice import resolve_route_scale as _resolve_route_scale


class AutoEP:
    def __init__(self, model: nn.Module, config: AutoEPConfig, **_: Any) -> None:
        self.model = model
        self.config = config
        self.model_config = getattr(model, "config", None)

    def _resolve_presets(self) -> str:
        return resolve_family(self.model, self.config)

    def ep_parser(self) -> list[MoELayerSpec]:
        return detect_moe_layers(self.model, self.config)

    def replace_moe_layer(
        self, spec: MoELayerSpec, ep_size: int, ep_rank: int, **_: Any
    ) -> AutoEPMoELayer:
        return replace_moe_layer(self.model, spec, ep_size, ep_rank, self.config, ep_repack.gather)


__all__ = ["AutoEP", "_resolve_route_scale"]
