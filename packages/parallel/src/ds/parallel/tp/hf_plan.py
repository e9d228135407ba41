"""transformers' tensor-parallel plan (``_tp_plan`` / ``base_model_tp_plan``) as layer specs.

transformers keeps the plan in three places: the config's ``base_model_tp_plan`` (keys relative
to the base model: ``layers.*.self_attn.q_proj``), the model class's ``_tp_plan`` (entries above
the base model: ``lm_head``) and, after ``from_pretrained``, an instance ``_tp_plan`` that may
repeat the base plan with a ``model.`` prefix. :func:`hf_tp_plan` merges them without those
duplicates; :func:`specs_from_hf_plan` turns the result into :class:`TPLayerSpec` objects.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .specs import PartitionType, TPLayerSpec

# The styles a plan may use here; any other rejects the whole plan (see specs_from_hf_plan).
# "colwise_rep" is transformers' older name for "colwise_gather_output".
HF_STYLES = frozenset(
    {
        "colwise",
        "colwise_rep",
        "colwise_gather_output",
        "rowwise",
        "embedding_rowwise",
        "replicated_with_grad_allreduce",
    }
)


def hf_tp_plan(model: Any) -> dict[str, str] | None:
    """The model's merged plan (config, class, then instance entries), or None when empty."""
    config = getattr(model, "config", None)
    sources = (
        getattr(config, "base_model_tp_plan", None) if config is not None else None,
        getattr(type(model), "_tp_plan", None),
        getattr(model, "__dict__", {}).get("_tp_plan"),
    )
    merged: dict[str, str] = {}
    seen: set[str] = set()
    for plan in sources:
        if not isinstance(plan, Mapping):
            continue
        for key, style in plan.items():
            bare = key.removeprefix("model.")
            if bare != key and bare in seen:
                continue  # the base plan again, under the base model's attribute name
            merged[key] = style
            seen.add(bare)
    return merged or None


def wildcard_to_regex(key: str) -> str:
    """A plan key (``layers.*.q_proj``) as a regex matching any parameter path ending in it."""
    return ".*" + key.replace(".", r"\.").replace("*", ".*")


def specs_from_hf_plan(plan: Mapping[str, str]) -> list[TPLayerSpec] | None:
    """One spec per plan entry; None for an empty plan (nothing to go on). A style outside
    :data:`HF_STYLES` rejects the whole plan: applying the rest could split one half of a
    column/row pair and leave the other whole."""
    if not plan:
        return None
    unknown = sorted({s for s in plan.values() if s.lower() not in HF_STYLES})
    if unknown:
        raise ValueError(
            f"the model's tp_plan uses unsupported partition style(s) {unknown}; a partial plan "
            "could split one half of a column/row pair, so none of it is applied. Give "
            "tensor_parallel.partition_config for this model instead"
        )
    specs = []
    for key, style in plan.items():
        style = style.lower()
        regex = wildcard_to_regex(key)
        regex += "$" if regex.endswith(r"\.weight") else r"\.weight$"
        if style.startswith("colwise"):
            kind, gather = PartitionType.COLUMN, style != "colwise"
        elif style == "rowwise":
            kind, gather = PartitionType.ROW, False
        else:  # embedding_rowwise stays whole here; grad-allreduce ones also sum their grads
            kind, gather = PartitionType.SKIP, False
        specs.append(
            TPLayerSpec(
                patterns=[regex],
                partition_type=kind,
                gather_output=gather,
                grad_allreduce=style == "replicated_with_grad_allreduce",
            )
        )
    return specs


__all__ = ["HF_STYLES", "hf_tp_plan", "specs_from_hf_plan", "wildcard_to_regex"]
