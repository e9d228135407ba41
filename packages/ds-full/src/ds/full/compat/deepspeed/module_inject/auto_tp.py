"""``deepspeed.module_inject.auto_tp``: DeepSpeed's ``AutoTP`` walker over ds's tensor-parallel
layers (:mod:`ds.parallel.tp`).

With a ``partition_config`` (layer specs), ``_replace_module`` visits every module with a 2-D
weight under its full dotted path (``layers.0.self_attn.q_proj``) and swaps in the layer its first
matching spec asks for; unmatched modules stay whole (``strict_mode`` refuses them). A weight
shared by several modules (a tied LM head) is left whole: splitting it for one of them would
untie it. Without layer specs, use ``ds.parallel.tp.autotp`` (the engine does, for
``tensor_parallel.autotp_size``): it places modules by the model's transformers plan and
name rules.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ds.full.compat.deepspeed.module_inject.autotp_config import (
    AutoTPConfig,
    PartitionType,
    TPLayerSpec,
)
from ds.full.compat.deepspeed.module_inject.layers import LinearAllreduce, LinearLayer, tp_group
from ds.interfaces.logging import get_logger
from ds.parallel.tp.autotp import parallel_module
from ds.parallel.tp.plan import COLWISE, COLWISE_GATHER, ROWWISE, Placement, spec_style
from ds.parallel.tp.specs import as_autotp_config

log = get_logger(__name__)


class AutoTP:
    def __init__(
        self,
        module: nn.Module,
        all_reduce_linears: Any,
        prefix: str,
        state_dict: Any,
        linear_layer_setting: Any,
        orig_layer_impl: Any,
        keep_module_on_host: bool = False,
        partition_config: AutoTPConfig | dict[str, Any] | None = None,
        vocab_parallel_lm_head: bool = False,
        model_config: Any = None,
        tp_grain_size: int = 1,
        training_mode: bool = False,
    ) -> None:
        self.module = module
        self.all_reduce_linears = all_reduce_linears
        self.prefix = prefix
        self.state_dict = state_dict
        self.linear_layer_setting = linear_layer_setting
        self.orig_layer_impl = orig_layer_impl
        self.partition_config = as_autotp_config(partition_config)
        self.training_mode = training_mode
        self.mp_size: int | None = None
        self.mp_group: Any = None
        # Weights several modules share, taken before any is replaced (a split copy is no longer
        # the shared tensor, so the tie could not be seen afterwards).
        owners: dict[int, int] = {}
        for m in module.modules():
            w = getattr(m, "weight", None)
            if isinstance(w, nn.Parameter):
                owners[id(w)] = owners.get(id(w), 0) + 1
        self._tied = {k for k, n in owners.items() if n > 1}

    def set_tensor_parallel_config(self, mp_size: int, mp_group: Any) -> None:
        self.mp_size, self.mp_group = mp_size, mp_group

    def update_linear_policies(self) -> None:
        # Modules are routed by layer spec here, not by type policies.
        return None

    def _get_model_type(self) -> str | None:
        model_type = getattr(getattr(self.module, "config", None), "model_type", None)
        return str(model_type).lower() if model_type is not None else None

    def _replace_with_config(self, child: nn.Module, name: str) -> nn.Module:
        assert self.partition_config is not None
        param = name if name.endswith(".weight") else name + ".weight"
        spec = self.partition_config.find_matching_spec(param, self._get_model_type())
        if spec is None:
            if self.partition_config.strict_mode:
                raise ValueError(f"no layer spec matches {param} (partition_config.strict_mode)")
            return child
        if spec.partition_type is PartitionType.SKIP and not spec.grad_allreduce:
            return child
        if id(getattr(child, "weight", None)) in self._tied:
            log.warning("autotp_tied_weight_kept_whole", module=name)
            return child
        style, fused = spec_style(spec)
        tp = tp_group(self.mp_group, self.mp_size)
        if style in (COLWISE, COLWISE_GATHER):
            return LinearLayer(
                child, tp, name=name, gather_output=style == COLWISE_GATHER, fused=fused
            )
        if style == ROWWISE:
            return LinearAllreduce(child, tp, name=name)
        new = parallel_module(child, Placement(style, fused, source="partition_config"), tp)
        return child if new is None else new

    def _replace_module(
        self, r_module: nn.Module, prev_name: str = "", prev_class_name: str = ""
    ) -> nn.Module:
        if self.partition_config is None:
            raise ValueError(
                "AutoTP._replace_module needs a partition_config (layer specs); for a model "
                "placed by its tp_plan and name rules use ds.parallel.tp.autotp"
            )
        path = ".".join(p for p in (prev_class_name, prev_name) if p)
        for name, child in r_module.named_children():
            full = f"{path}.{name}" if path else name
            weight = getattr(child, "weight", None)
            if isinstance(child, nn.Embedding | nn.Linear) or (
                weight is not None and getattr(weight, "dim", lambda: 0)() == 2
            ):
                new = self._replace_with_config(child, full)
                if new is not child:
                    setattr(r_module, name, new)
            else:
                self._replace_module(child, name, path)
        return r_module


__all__ = ["AutoTP", "AutoTPConfig", "PartitionType", "TPLayerSpec"]
