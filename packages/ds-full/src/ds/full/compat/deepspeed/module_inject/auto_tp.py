"""``deepspeed.module_inject.auto_tp``: DeepSpeed's ``AutoTP`` walker over ds's tensor-parallel
layers (:mod:`ds.parallel.tp`).

``_replace_module`` visits every module with a 2-D weight under its full dotted path
(``layers.0.self_attn.q_proj``) and swaps in the layer its first matching layer spec
(``partition_config``) asks for, unmatched modules staying whole (``strict_mode`` refuses them);
without layer specs ds's own placement decides (the model's tp_plan, then name rules:
:func:`ds.parallel.tp.plan_for`). A weight shared by several modules (a tied LM head) is left
whole: splitting it for one of them would untie it. An AutoEP layer's experts are left to expert
parallelism; its shared expert is split like any MLP.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ds.full.compat.deepspeed.module_inject.autotp_config import (
    AutoTPConfig,
    PartitionType,
    TPLayerSpec,
)
from ds.full.compat.deepspeed.module_inject.layers import (
    LinearAllreduce,
    LinearLayer,
    is_autotp_training_mode,
    tp_group,
)
from ds.interfaces.logging import get_logger
from ds.parallel.tp.autotp import parallel_module
from ds.parallel.tp.plan import (
    COLWISE,
    COLWISE_GATHER,
    REPLICATE,
    ROWWISE,
    Placement,
    plan_for,
    spec_style,
)
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
        self._rules: dict[str, Placement] | None = None

    def set_tensor_parallel_config(self, mp_size: int, mp_group: Any) -> None:
        if is_autotp_training_mode():  # training: the job's tensor-parallel group
            from ds import comm
            from ds.full.compat.deepspeed.utils import groups

            mp_group = groups.get_tensor_model_parallel_group()
            mp_size = comm.get_world_size(mp_group)
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
        style, fused = spec_style(spec)
        return self._build(child, name, Placement(style, fused, source="partition_config"))

    def _replace_by_rules(self, child: nn.Module, name: str) -> nn.Module:
        # Without layer specs, ds's own placement: the model's tp_plan, then its name rules.
        if self._rules is None:
            self._rules = plan_for(self.module)
        placement = self._rules.get(name)
        return child if placement is None else self._build(child, name, placement)

    def _build(self, child: nn.Module, name: str, p: Placement) -> nn.Module:
        if id(getattr(child, "weight", None)) in self._tied and p.style != REPLICATE:
            log.warning("autotp_tied_weight_kept_whole", module=name)
            return child
        tp = tp_group(self.mp_group, self.mp_size)
        if p.style in (COLWISE, COLWISE_GATHER) and not p.transposed:
            gather = p.style == COLWISE_GATHER
            return LinearLayer(child, tp, name=name, gather_output=gather, fused=p.fused)
        if p.style == ROWWISE and not p.transposed:
            return LinearAllreduce(child, tp, name=name)
        new = parallel_module(child, p, tp)
        return child if new is None else new

    def _replace_child(self, child: nn.Module, name: str) -> nn.Module:
        if self.partition_config is not None:
            return self._replace_with_config(child, name)
        return self._replace_by_rules(child, name)

    def _replace_autoep_shared_experts(self, autoep_layer: nn.Module, autoep_name: str) -> None:
        """An AutoEP layer's experts are split over the expert-parallel group, not here; its
        shared expert (and that expert's gate) is an ordinary MLP that tensor parallelism splits."""
        for child_name in ("shared_experts", "shared_experts_gate"):
            child = getattr(autoep_layer, child_name, None)
            if child is None:
                continue
            full = f"{autoep_name}.{child_name}" if autoep_name else child_name
            if _is_2d(child):
                setattr(autoep_layer, child_name, self._replace_child(child, full))
            else:
                self._replace_module(child, child_name, autoep_name)

    def _replace_module(
        self, r_module: nn.Module, prev_name: str = "", prev_class_name: str = ""
    ) -> nn.Module:
        path = ".".join(p for p in (prev_class_name, prev_name) if p)
        for name, child in r_module.named_children():
            full = f"{path}.{name}" if path else name
            if getattr(child, "_is_autoep_layer", False):
                self._replace_autoep_shared_experts(child, full)
            elif _is_2d(child):
                new = self._replace_child(child, full)
                if new is not child:
                    setattr(r_module, name, new)
            else:
                self._replace_module(child, name, path)
        return r_module


def _is_2d(module: nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return isinstance(module, nn.Embedding | nn.Linear) or (
        weight is not None and getattr(weight, "dim", lambda: 0)() == 2
    )


__all__ = ["AutoTP", "AutoTPConfig", "PartitionType", "TPLayerSpec"]
