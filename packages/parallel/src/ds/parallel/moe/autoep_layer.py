"""DeepSpeed-layout AutoEP: find a model's MoE blocks and replace each with :class:`AutoEPMoELayer`.

:func:`detect_moe_layers` walks the model for the blocks of its family (``mlp`` modules with a
router ``gate`` and ``experts``, stored as fused ``[E, 2I, H]``/``[E, H, I]`` tensors or as a
list of per-expert MLPs) and describes each as a :class:`MoELayerSpec`. :class:`AutoEPMoELayer`
keeps the block's router as a :class:`TokenChoiceTopKRouter` (dropless top-k), this rank's
``E / ep_size`` experts as :class:`GroupedExperts` and any shared expert; its forward sorts the
routes by expert, sends each to the rank owning its expert (one all-to-all of variable sizes,
through ``bind(comm, groups)``), runs the experts, sends the results back and sums each token's
routes with their router weights.

``gather`` (optional) is a context-manager factory that makes ZeRO-3 partitioned source
parameters (those with a ``ds_id``) whole while they are copied, like ``GatheredParameters``.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from ds.interfaces.errors import ConfigError
from ds.interfaces.moe import EXPERT_SLICE_ATTR, REPLICA_ATTR, ExpertSlice, ReplicaGroup

from .autoep import _exchange, _VarAllToAll
from .autoep_config import (
    AutoEPConfig,
    MoELayerSpec,
    family_adapter,
    preset_name_for_hf_model_type,
    unsupported_preset_for_hf_model_type,
)
from .fused_layout import classify_fused_gate_up_layout
from .groups import expert_groups
from .routes import combine_from_routed
from .token_choice import (
    GroupedExperts,
    TokenChoiceTopKRouter,
    apply_scores_before_experts,
    resolve_route_scale,
)

Gather = Callable[[list[nn.Parameter]], Any]

# Per family: expert-count attribute, score function, whether top-k weights are renormalised,
# shared-expert (and its gate) child names, and whether the family routes by expert groups.
_FAMILIES: dict[str, dict[str, Any]] = {
    "mixtral": {"num": "num_local_experts", "score": "softmax", "norm": True},
    "qwen3_moe": {
        "num": "num_experts",
        "score": "softmax",
        "norm": "norm_topk_prob",
        "shared": ("shared_expert", "shared_expert_gate"),
    },
    "qwen3_5_moe": {
        "num": "num_experts",
        "score": "softmax",
        "norm": "norm_topk_prob",
        "shared": ("shared_expert", "shared_expert_gate"),
    },
    "deepseek_v2": {"num": "n_routed_experts", "score": "softmax", "norm": "norm_topk_prob"},
    "deepseek_v3": {
        "num": "n_routed_experts",
        "score": "sigmoid",
        "norm": "norm_topk_prob",
        "shared": ("shared_experts", ""),
        "groups": True,
    },
}
_LAYER_PATTERN = r"(.*\.)?layers\.\d+\.(mlp|block_sparse_moe)"


def resolve_family(model: nn.Module, config: AutoEPConfig) -> str:
    """The model's AutoEP family: the configured preset, else by transformers model_type."""
    hf = getattr(model, "config", None)
    model_type = str(getattr(hf, "model_type", ""))
    family = config.preset_model
    if family is None:
        refused = unsupported_preset_for_hf_model_type(model_type)
        family = refused[0] if refused is not None else preset_name_for_hf_model_type(model_type)
    if family not in _FAMILIES:
        raise ValueError(
            f"AutoEP knows no MoE family {family or model_type!r}; set "
            f"expert_parallel.preset_model to one of {list(_FAMILIES)}"
        )
    family_adapter(family).validate_compatibility(hf)
    return family


def _maybe_gathered(gather: Gather | None, params: Sequence[Any]) -> Any:
    live = [p for p in params if p is not None]
    if gather is None or not any(hasattr(p, "ds_id") for p in live):
        return contextlib.nullcontext()
    return gather(live)


def _shape(t: torch.Tensor) -> tuple[int, ...]:
    # A ZeRO-3 partitioned parameter keeps its full shape in ds_shape.
    return tuple(getattr(t, "ds_shape", t.shape))


def _expert_layout(
    experts: nn.Module, config: AutoEPConfig
) -> tuple[str, str, str, str | None, int, int]:
    """(storage, w1, w2, w3, hidden, ffn) of an experts module."""
    w1 = config.expert_w1 or "gate_up_proj"
    w2 = config.expert_w2 or "down_proj"
    fused = getattr(experts, w1, None), getattr(experts, w2, None)
    if all(isinstance(t, torch.Tensor) and len(_shape(t)) == 3 for t in fused):
        layout = classify_fused_gate_up_layout(_shape(fused[0]), _shape(fused[1]))  # type: ignore[arg-type]
        if layout is None:
            raise ValueError(f"experts {w1}/{w2} shapes do not form a fused gate/up layout")
        return "fused_3d", w1, w2, None, layout.hidden_size, layout.ffn_hidden_size
    if isinstance(experts, nn.ModuleList) and len(experts):
        w1, w2 = config.expert_w1 or "gate_proj", config.expert_w2 or "down_proj"
        w3 = config.expert_w3 if isinstance(config.expert_w3, str) else "up_proj"
        out, hidden = _shape(getattr(experts[0], w1).weight)
        return "module_list", w1, w2, w3, hidden, out
    raise ValueError(
        f"experts module {type(experts).__name__} is neither fused 3-D tensors nor a list"
    )


def detect_moe_layers(model: nn.Module, config: AutoEPConfig) -> list[MoELayerSpec]:
    family = resolve_family(model, config)
    info = _FAMILIES[family]
    hf = getattr(model, "config", None)
    router_name = config.router_pattern or "gate"
    experts_name = config.expert_pattern or "experts"
    pattern = re.compile(config.moe_layer_pattern or _LAYER_PATTERN)
    shared, shared_gate = info.get("shared", ("", ""))
    specs = []
    for name, block in model.named_modules():
        router = getattr(block, router_name, None)
        experts = getattr(block, experts_name, None)
        if not pattern.fullmatch(name) or router is None or experts is None:
            continue
        storage, w1, w2, w3, hidden, ffn = _expert_layout(experts, config)
        num = getattr(hf, config.num_experts_attr or info["num"], None) or (
            len(experts) if storage == "module_list" else _shape(experts.get_parameter(w1))[0]
        )
        top_k = config.top_k if isinstance(config.top_k, int) else None
        top_k = top_k or getattr(hf, config.top_k_attr or "num_experts_per_tok", None)
        norm = (
            info["norm"]
            if isinstance(info["norm"], bool)
            else bool(getattr(hf, info["norm"], True))
        )
        groups = (
            (config.num_expert_groups or getattr(hf, "n_group", None))
            if info.get("groups")
            else None
        )
        limited = (config.num_limited_groups or getattr(hf, "topk_group", None)) if groups else None
        has_shared = bool(shared) and getattr(block, shared, None) is not None
        specs.append(
            MoELayerSpec(
                moe_module_name=name,
                model_family=family,
                router_name=router_name,
                experts_name=experts_name,
                expert_storage=storage,
                expert_w1_name=w1,
                expert_w2_name=w2,
                expert_w3_name=w3,
                num_experts=int(num),
                top_k=int(top_k or getattr(block, "top_k", 2)),
                hidden_size=hidden,
                ffn_hidden_size=ffn,
                score_func=config.score_func if config.score_func != "auto" else info["score"],
                score_apply="post",
                route_norm=norm if config.route_norm is None else config.route_norm,
                gate_bias=getattr(router, "bias", None) is not None,
                return_router_logits=False,
                router_logits_capture_target="none",
                router_logits_capture_index=None,
                router_logits_capture_layer_name=None,
                has_shared_experts=has_shared,
                shared_experts_name=shared if has_shared else "",
                shared_experts_gate_name=shared_gate if has_shared else "",
                route_scale=resolve_route_scale(config, hf),
                num_expert_groups=groups,
                num_limited_groups=limited,
                supports_expert_bias=family != "deepseek_v2",
            )
        )
    return specs


def _same(tensors: Sequence[torch.Tensor], what: str) -> None:
    if len({(t.dtype, t.device) for t in tensors}) > 1:
        raise ValueError(f"{what}: experts have mixed dtype/device; make them agree first")
    if len({t.requires_grad for t in tensors}) > 1:
        raise ValueError(f"{what}: experts have mixed requires_grad flags; freeze all or none")


def repack_experts(
    experts: nn.Module, spec: MoELayerSpec, ep_rank: int, ep_size: int, gather: Gather | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """This rank's experts as stacked ``w1`` (gate), ``w2`` (down), ``w3`` (up) tensors, copied
    from the source in its dtype and device (``requires_grad`` as the source's)."""
    if spec.num_experts % ep_size:
        raise ValueError(
            f"num_experts={spec.num_experts} is not divisible by autoep_size={ep_size}"
        )
    local = spec.num_experts // ep_size
    keep = range(ep_rank * local, (ep_rank + 1) * local)
    if spec.expert_storage == "fused_3d":
        gu, down = (
            experts.get_parameter(spec.expert_w1_name),
            experts.get_parameter(spec.expert_w2_name),
        )
        with _maybe_gathered(gather, [gu, down]), torch.no_grad():
            layout = classify_fused_gate_up_layout(tuple(gu.shape), tuple(down.shape))
            g, d = gu.data[keep.start : keep.stop], down.data[keep.start : keep.stop]
            if layout is not None and layout.needs_transpose:
                g, d = g.transpose(1, 2), d.transpose(1, 2)
            w1, w3 = g[:, : spec.ffn_hidden_size].clone(), g[:, spec.ffn_hidden_size :].clone()
            w2 = d.clone()
        flags = (gu.requires_grad, down.requires_grad, gu.requires_grad)
    else:
        names = (spec.expert_w1_name, spec.expert_w2_name, spec.expert_w3_name or "up_proj")
        per = [[getattr(e, n).weight for n in names] for e in experts]
        for i, what in enumerate(names):
            _same([p[i] for p in per], f"experts.*.{what}")
        _same([w for p in per for w in p], "experts")
        stacks: list[list[torch.Tensor]] = [[], [], []]
        for e, params in enumerate(per):  # every expert, in order: a collective under ZeRO-3
            with _maybe_gathered(gather, params), torch.no_grad():
                if e in keep:
                    for i, p in enumerate(params):
                        stacks[i].append(p.data.clone())
        w1, w2, w3 = (torch.stack(s) for s in stacks)
        flags = (per[0][0].requires_grad,) * 3
    return tuple(w.requires_grad_(f) for w, f in zip((w1, w2, w3), flags, strict=True))  # type: ignore[return-value]


def _copy_param(src: torch.Tensor, gather: Gather | None) -> nn.Parameter:
    with _maybe_gathered(gather, [src]), torch.no_grad():
        return nn.Parameter(src.data.clone(), requires_grad=src.requires_grad)


class AutoEPMoELayer(nn.Module):
    _is_autoep_layer = True

    def __init__(
        self,
        spec: MoELayerSpec,
        source_module: nn.Module,
        ep_size: int,
        ep_rank: int,
        config: AutoEPConfig,
        deepep_scope: int | None = None,
        gather: Gather | None = None,
    ) -> None:
        super().__init__()
        if config.load_balance_coeff is not None:
            what = (
                "this family has no expert bias"
                if not spec.supports_expert_bias
                else "not implemented"
            )
            raise ValueError(
                f"load_balance_coeff/expert_bias load balancing ({what}); set "
                "expert_parallel.load_balance_coeff to null"
            )
        self.spec, self.config = spec, config
        self.ep_size, self.ep_rank = ep_size, ep_rank
        self.num_experts = spec.num_experts
        self.num_local_experts = spec.num_experts // ep_size
        self.top_k = spec.top_k
        self.ep_group_name = f"ep_size_{ep_size}"
        self.score_apply = config.score_apply if config.score_apply != "auto" else spec.score_apply
        self.combine_impl = (
            config.combine_impl
            if config.combine_impl not in ("auto", "fused_weighted_sum")
            else "weighted_sum"
        )
        src_router = getattr(source_module, spec.router_name)
        self.router = TokenChoiceTopKRouter(
            spec.hidden_size,
            spec.num_experts,
            spec.num_expert_groups,
            spec.num_limited_groups,
            spec.top_k,
            spec.score_func,
            spec.route_norm,
            spec.route_scale,
            spec.gate_bias,
            spec.group_score_func,
        )
        if isinstance(src_router, nn.Linear):
            self.router.gate.weight = _copy_param(src_router.weight, gather)
            if spec.gate_bias and src_router.bias is not None:
                self.router.gate.bias = _copy_param(src_router.bias, gather)
        else:
            # A model's own router module (transformers' routers return their logits first) stays
            # as the gate, so that the model's output recorders still capture its router logits.
            src_router.weight = _copy_param(src_router.weight, gather)
            self.router.gate = src_router
        bias = getattr(src_router, "e_score_correction_bias", None)
        if isinstance(bias, torch.Tensor):
            self.router.e_score_correction_bias = _copy_param(bias, gather)
        w1, w2, w3 = repack_experts(
            getattr(source_module, spec.experts_name), spec, ep_rank, ep_size, gather
        )
        self.experts = GroupedExperts(
            spec.hidden_size,
            spec.ffn_hidden_size,
            self.num_local_experts,
            use_grouped_mm=False,
            activation=spec.expert_activation,
            activation_alpha=spec.expert_activation_alpha,
            activation_limit=spec.expert_activation_limit,
        )
        for name, w in (("w1", w1), ("w2", w2), ("w3", w3)):
            setattr(self.experts, name, nn.Parameter(w, requires_grad=w.requires_grad))
        for p in self.experts.parameters():
            p.allreduce = False  # type: ignore[attr-defined]  # expert parameters: own groups
            p.group_name = self.ep_group_name  # type: ignore[attr-defined]
            if ep_size > 1:  # each rank's rows of the [E, ...] stack, under one name everywhere
                full = (spec.num_experts, *p.shape[1:])
                setattr(p, EXPERT_SLICE_ATTR, ExpertSlice(full, ep_rank * self.num_local_experts))
        self.shared_experts = (
            getattr(source_module, spec.shared_experts_name, None)
            if spec.has_shared_experts
            else None
        )
        gate_name = spec.shared_experts_gate_name
        self.shared_experts_gate = getattr(source_module, gate_name, None) if gate_name else None
        self._comm: Any = None
        self._group: Any = None
        self._fold: Any = None  # a TPFold when expert parallelism is folded onto TP
        self.folding_group_handles: Any = None

    def bind(self, comm: Any, ep_group: Any = None) -> None:
        """The communicator and expert-parallel group the forward exchanges routes over. Without
        ``ep_group`` this rank joins (creating them on first use: collective) the expert groups of
        ``ep_size`` (:func:`ds.parallel.moe.groups.expert_groups`), which must put it at the
        position the layer's experts were taken for, and the experts are marked with their
        expert-data-parallel replicas for the engine."""
        if ep_group is None and comm is not None:
            groups = expert_groups(comm, self.ep_size)
            if groups.ep_rank != self.ep_rank:
                raise ConfigError(
                    f"AutoEPMoELayer holds the experts of expert-parallel rank {self.ep_rank} "
                    f"but this rank is rank {groups.ep_rank} of its group {groups.ep_ranks}; "
                    "build it with ep_rank set to that position"
                )
            ep_group = groups.ep_group
            for p in self.experts.parameters():
                setattr(p, REPLICA_ATTR, groups.replicas)
        self._comm, self._group = comm, ep_group

    def bind_folded(self, comm: Any, handles: Any) -> None:
        """Fold expert parallelism onto tensor parallelism (:mod:`ds.parallel.moe.folded`):
        ``handles`` is a :class:`~ds.parallel.moe.folding.FoldingGroupHandles` whose expert
        group puts this rank at ``ep_rank``; its TP ranks then share the routes."""
        from .folded import TPFold

        rank = int(comm.get_rank())
        if handles.ep_ranks.index(rank) != self.ep_rank:
            raise ConfigError(
                f"AutoEPMoELayer holds the experts of expert-parallel rank {self.ep_rank} but "
                f"this rank is rank {handles.ep_ranks.index(rank)} of {handles.ep_ranks}"
            )
        self._comm, self._group = comm, handles.ep_group
        replicas = ReplicaGroup(self.ep_group_name, handles.edp_group, handles.edp_ranks)
        for p in self.experts.parameters():
            setattr(p, REPLICA_ATTR, replicas)
        tp = handles.spec.tp_size
        tp_rank = handles.tp_ranks.index(rank)
        self._fold = TPFold(comm, handles.tp_group, tp_rank, tp) if tp > 1 else None
        self.folding_group_handles = handles

    @property
    def ep_group(self) -> Any:
        """The expert-parallel group the routes are exchanged over (None before binding)."""
        return self._group

    def set_deepspeed_parallelism(
        self, comm: Any = None, folding_group_handles: Any = None, **_: Any
    ) -> None:
        """DeepSpeed's name of :meth:`bind` (:meth:`bind_folded` with ``folding_group_handles``)."""
        if comm is None:
            raise ConfigError(
                "set_deepspeed_parallelism needs the communicator in ds: ds.initialize binds "
                "AutoEP layers itself; or pass ds.comm.get_communicator()"
            )
        if folding_group_handles is not None:
            self.bind_folded(comm, folding_group_handles)
        else:
            self.bind(comm)

    def _run(self, rows: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        """Rows sorted by (global) expert -> their expert outputs, same order."""
        if self.ep_size == 1:
            return self.experts(rows, torch.bincount(experts, minlength=self.num_experts))
        if self._comm is None:
            raise ConfigError(
                f"AutoEPMoELayer with ep_size={self.ep_size} needs bind(comm, ep_group) first"
            )
        owner = torch.div(experts, self.num_local_experts, rounding_mode="floor")
        send = torch.bincount(owner, minlength=self.ep_size)
        recv = torch.empty_like(send)
        self._comm.all_to_all_single(recv, send, group=self._group)
        s, r = send.tolist(), recv.tolist()
        ids = (
            _exchange(self._comm, self._group, experts, s, r)
            - self.ep_rank * self.num_local_experts
        )
        got = _VarAllToAll.apply(self._comm, self._group, rows, s, r)
        order = torch.argsort(ids, stable=True)
        out = self.experts(got[order], torch.bincount(ids, minlength=self.num_local_experts))
        back = torch.empty_like(out).index_copy(0, order, out)
        return _VarAllToAll.apply(self._comm, self._group, back, r, s)  # type: ignore[no-any-return]

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1])
        scores, selected, _ = self.router(x)
        flat = selected.reshape(-1)
        order = torch.argsort(flat, stable=True)
        fold = self._fold
        if fold is None:
            rows = apply_scores_before_experts(
                x[order // self.top_k], scores.reshape(-1)[order], self.score_apply
            )
            out = self._run(rows, flat[order])
        else:  # this TP rank sends its share of the routes; the outputs come back whole
            shares = fold.shares(flat[order])
            pick = order[shares[fold.rank]]
            weights = scores.reshape(-1)
            if self.score_apply == "pre":
                weights = fold.share_input(weights)
            rows = apply_scores_before_experts(
                fold.share_input(x)[pick // self.top_k], weights[pick], self.score_apply
            )
            out = fold.gather(self._run(rows, flat[pick]), shares)
        tokens = x.shape[0]
        y = combine_from_routed(
            out,
            scores,
            order,
            self.top_k,
            self.score_apply,
            self.combine_impl,
            (1, tokens, shape[-1]),
        )
        y = y.reshape(tokens, shape[-1])
        if self.shared_experts is not None:
            shared = self.shared_experts(x)
            if self.shared_experts_gate is not None:
                shared = torch.sigmoid(self.shared_experts_gate(x)) * shared
            y = y + shared
        return y.reshape(shape)


def replace_moe_layer(
    model: nn.Module,
    spec: MoELayerSpec,
    ep_size: int,
    ep_rank: int,
    config: AutoEPConfig,
    gather: Gather | None = None,
) -> AutoEPMoELayer:
    parent_name, _, leaf = spec.moe_module_name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    layer = AutoEPMoELayer(spec, getattr(parent, leaf), ep_size, ep_rank, config, gather=gather)
    setattr(parent, leaf, layer)
    return layer


def iter_autoep_layers(model: nn.Module) -> Iterator[AutoEPMoELayer]:
    return (m for m in model.modules() if isinstance(m, AutoEPMoELayer))


__all__ = [
    "AutoEPMoELayer",
    "detect_moe_layers",
    "iter_autoep_layers",
    "repack_experts",
    "replace_moe_layer",
    "resolve_family",
]
