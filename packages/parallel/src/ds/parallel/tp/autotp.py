"""``autotp``: split a transformers model over the tensor-parallel group, in place.

Everything is checked before any module is changed (head counts, divisibility of every split
dimension, modules no rule places), so a refused model is left as it was.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from ds.interfaces.errors import ConfigError
from ds.interfaces.logging import get_logger

from ._collectives import TPGroup
from .layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    allreduce_grads_of,
)
from .plan import (
    COLWISE,
    COLWISE_GATHER,
    REPLICATE,
    REPLICATE_GRAD_ALLREDUCE,
    ROWWISE,
    VOCAB_EMBEDDING,
    Placement,
    plan_for,
)

log = get_logger(__name__)

# Children whose column split divides the heads of their parent attention module.
_HEAD_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "c_attn", "query", "key", "value", "qkv_proj")
_HEAD_ATTRS = ("num_heads", "num_attention_heads", "num_key_value_heads", "num_kv_heads", "n_head")


@dataclass
class AutoTPResult:
    """What ``autotp`` did: the TP size and rank and each module's placement."""

    size: int
    rank: int
    plan: dict[str, Placement] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        sharded = {n: p.style for n, p in self.plan.items() if p.style != REPLICATE}
        return {"tp_size": self.size, "tp_rank": self.rank, "modules": sharded}


def tp_group_of(mesh_or_tp_group: Any, comm: Any) -> TPGroup:
    """A mesh (its "tp" group) or a group handle (None: the whole world) as a TPGroup."""
    if isinstance(mesh_or_tp_group, TPGroup):
        return mesh_or_tp_group
    if hasattr(mesh_or_tp_group, "shape") and callable(getattr(mesh_or_tp_group, "group", None)):
        mesh = mesh_or_tp_group
        return TPGroup(comm, mesh.group("tp"), int(mesh.shape.tp), int(mesh.index("tp")))
    group = mesh_or_tp_group
    return TPGroup(comm, group, int(comm.get_world_size(group)), int(comm.get_rank(group)))


def _text_config(model: Any) -> Any:
    # a model, or a transformers config itself (checked before any model is allocated)
    config = model if not isinstance(model, nn.Module) else getattr(model, "config", None)
    getter = getattr(config, "get_text_config", None)
    return getter() if callable(getter) else config


def check_heads(model_or_config: Any, tp_size: int) -> None:
    """Attention and key/value head counts must divide by the TP size (GQA included). Takes the
    model or its transformers config, so a launcher can refuse before allocating the model."""
    model = model_or_config
    config = _text_config(model)
    if config is None or tp_size == 1:
        return
    heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_head", None)
    kv = getattr(config, "num_key_value_heads", None) or heads
    for key, value in (("num_attention_heads", heads), ("num_key_value_heads", kv)):
        if isinstance(value, int) and value % tp_size:
            raise ConfigError(
                f"{key}={value} does not divide by tensor_parallel.autotp_size={tp_size}; "
                f"choose an autotp_size that divides {value}"
            )


def _split_size(module: nn.Module, p: Placement) -> tuple[str, int]:
    w = module.weight
    if p.style in (COLWISE, COLWISE_GATHER):
        return "output features", int(w.shape[1 if p.transposed else 0])
    if p.style == ROWWISE:
        return "input features", int(w.shape[0 if p.transposed else 1])
    return "rows (vocabulary)", int(w.shape[0])


def _resolve(model: nn.Module, plan: dict[str, Placement], tp: int) -> dict[str, Placement]:
    """Check every split divides; the vocabulary that does not stays replicated (with its tie)."""
    modules = dict(model.named_modules())
    out = dict(plan)
    for name, p in plan.items():
        if p.style not in (COLWISE, COLWISE_GATHER, ROWWISE, VOCAB_EMBEDDING):
            continue
        what, size = _split_size(modules[name], p)
        if size % (tp * p.fused) == 0:
            continue
        if p.style in (VOCAB_EMBEDDING, COLWISE_GATHER):
            log.warning("autotp_vocab_replicated", module=name, size=size, tp=tp)
            out[name] = Placement(REPLICATE, 1, p.transposed, p.source)
            continue
        parts = f"{p.fused} x {tp}" if p.fused > 1 else f"{tp}"
        raise ConfigError(
            f"module {name!r}: {what} {size} do not divide into {parts} tensor-parallel slices; "
            f"choose an autotp_size dividing {size // p.fused}, or partition_config="
            f"{{{name.rsplit('.', 1)[-1] + '$'!r}: 'replicate'}}"
        )
    # A weight shared by several modules (tied embedding and LM head) is split the same way by
    # all of them or by none.
    by_weight: dict[int, list[str]] = {}
    for name in out:
        w = getattr(modules[name], "weight", None)
        if w is not None:
            by_weight.setdefault(id(w), []).append(name)
    for names in by_weight.values():
        dims = {_weight_dim(out[n]) for n in names}
        if len(dims) > 1:
            log.warning("autotp_tied_replicated", modules=names)
            for n in names:
                out[n] = Placement(REPLICATE, 1, out[n].transposed, out[n].source)
    return out


def _weight_dim(p: Placement) -> tuple[int, int] | None:
    """(split dim, packed segments) of the placement's weight; None when it stays whole."""
    if p.style in (COLWISE, COLWISE_GATHER):
        return (1 if p.transposed else 0), p.fused
    if p.style == ROWWISE:
        return (0 if p.transposed else 1), 1
    if p.style == VOCAB_EMBEDDING:
        return 0, 1
    return None


def _check_module_heads(model: nn.Module, plan: dict[str, Placement], tp: int) -> None:
    """Head counts an attention module keeps as attributes must divide by TP. A model without a
    transformers config (a pipeline stage's layers) is checked here only, and its q/k/v features
    can divide by TP while its heads do not: 3 heads of 4 features (12) cut into 2 slices of 6
    would split a head between two ranks."""
    for name, p in plan.items():
        parent_name, _, leaf = name.rpartition(".")
        if p.style != COLWISE or leaf not in _HEAD_PROJECTIONS:
            continue
        parent = model.get_submodule(parent_name) if parent_name else model
        for attr in _HEAD_ATTRS:
            value = parent.__dict__.get(attr)
            if isinstance(value, int) and not isinstance(value, bool) and value % tp:
                raise ConfigError(
                    f"module {parent_name!r}: {attr}={value} does not divide by "
                    f"tensor_parallel.autotp_size={tp}; choose an autotp_size that divides "
                    f"{value}"
                )


def _localize_heads(parent: nn.Module, tp: int, fused_child: bool) -> None:
    # transformers' attention forwards mostly reshape with -1 heads; the attributes some read
    # (GPT-2's split_size, older modules' num_heads) must describe this rank's heads.
    for attr in _HEAD_ATTRS:
        value = parent.__dict__.get(attr)
        if isinstance(value, int) and not isinstance(value, bool):
            setattr(parent, attr, value // tp)
    if fused_child:
        for attr in ("split_size", "embed_dim"):
            value = parent.__dict__.get(attr)
            if isinstance(value, int):
                setattr(parent, attr, value // tp)


def parallel_module(
    module: nn.Module, p: Placement, tp: TPGroup, cache: dict[int, Any] | None = None
) -> nn.Module | None:
    """The tensor-parallel replacement of one module placed ``p`` (None: it stays; a
    replicated-with-gradient-all-reduce module gets its gradient hooks here). ``cache`` keeps
    tied parameters tied across calls."""
    if p.style in (COLWISE, COLWISE_GATHER):
        return ColumnParallelLinear.from_module(
            module,
            tp,
            transposed=p.transposed,
            gather_output=p.style == COLWISE_GATHER,
            fused=p.fused,
            cache=cache,
        )
    if p.style == ROWWISE:
        return RowParallelLinear.from_module(module, tp, transposed=p.transposed, cache=cache)
    if p.style == VOCAB_EMBEDDING:
        return VocabParallelEmbedding.from_module(module, tp, cache=cache)
    if p.style == REPLICATE_GRAD_ALLREDUCE:
        allreduce_grads_of(module, tp)
    return None


def autotp(
    model: nn.Module,
    mesh_or_tp_group: Any,
    comm: Any,
    partition_config: Any = None,
    whole: Sequence[str] = (),
) -> AutoTPResult:
    """Replace the model's linear and embedding modules by tensor-parallel ones holding this
    rank's slice (in place). Call on every rank of the TP group, before creating the optimizer;
    all ranks must start from the same weights (same seed or same checkpoint). ``whole``:
    modules (with their children) left unsplit, e.g. the MoE blocks expert parallelism holds."""
    tp = tp_group_of(mesh_or_tp_group, comm)
    plan = plan_for(model, partition_config, whole)
    result = AutoTPResult(tp.size, tp.rank, plan)
    if tp.size == 1:
        return result
    if any(p.style in (COLWISE, ROWWISE) for p in plan.values()):
        check_heads(model, tp.size)
    plan = _resolve(model, plan, tp.size)
    _check_module_heads(model, plan, tp.size)
    result.plan = plan
    # Nothing above changed the model; from here on it is rewritten.
    cache: dict[int, Any] = {}
    attention_parents: dict[str, bool] = {}
    for name, p in plan.items():
        parent_name, _, leaf = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        module = getattr(parent, leaf)
        new = parallel_module(module, p, tp, cache)
        if p.style == COLWISE and leaf in _HEAD_PROJECTIONS:
            attention_parents[parent_name] = attention_parents.get(parent_name, False) or (
                p.fused > 1
            )
        if new is not None:
            setattr(parent, leaf, new)
    for parent_name, fused in attention_parents.items():
        parent = model.get_submodule(parent_name) if parent_name else model
        _localize_heads(parent, tp.size, fused)
    model.ds_autotp = result  # type: ignore[assignment]
    return result


__all__ = ["AutoTPResult", "autotp", "check_heads", "parallel_module", "tp_group_of"]
