"""Which tensor-parallel style each module of a model gets.

Sources, per module, first match wins: the user's ``partition_config`` (an explicit choice
overrides the automatic ones), the model's transformers plan (``model.tp_plan``: the class's
``_tp_plan`` plus the config's ``base_model_tp_plan``), then ds's name rules (Llama/Mistral/Qwen
projection names, GPT-2's Conv1D ``c_attn``/``c_fc``/``c_proj``, the LM head and the token
embedding). A linear layer none of them places is an error naming it and the fix.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from ds.interfaces.errors import ConfigError

#: Internal styles.
COLWISE = "colwise"  # output features split, output stays sharded
COLWISE_GATHER = "colwise_gather"  # output features split, output all-gathered (the LM head)
ROWWISE = "rowwise"  # input features split, output all-reduced
VOCAB_EMBEDDING = "vocab_embedding"  # embedding rows (the vocabulary) split
REPLICATE = "replicate"  # left as it is on every rank
REPLICATE_GRAD_ALLREDUCE = "replicate_grad_allreduce"  # replicated, gradient summed over TP

SHARDED = (COLWISE, COLWISE_GATHER, ROWWISE, VOCAB_EMBEDDING)

# transformers' style names (and DeepSpeed's partition types) -> ds's, with the packed segments.
_HF_STYLES: dict[str, tuple[str, int]] = {
    "colwise": (COLWISE, 1),
    "column": (COLWISE, 1),
    "colwise_rep": (COLWISE_GATHER, 1),
    "colwise_gather_output": (COLWISE_GATHER, 1),
    "rowwise": (ROWWISE, 1),
    "row": (ROWWISE, 1),
    "rowwise_rep": (ROWWISE, 1),
    "embedding_rowwise": (VOCAB_EMBEDDING, 1),
    "vocab": (VOCAB_EMBEDDING, 1),
    "packed_colwise": (COLWISE, 2),
    "replicated_with_grad_allreduce": (REPLICATE_GRAD_ALLREDUCE, 1),
    "replicate": (REPLICATE, 1),
    "replicated": (REPLICATE, 1),
    "skip": (REPLICATE, 1),
    "local": (REPLICATE, 1),
}

_COLWISE_NAMES = {
    "q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "query", "key", "value",
    "fc1", "w1", "w3", "c_fc", "dense_h_to_4h", "wq", "wk", "wv",
}  # fmt: skip
_ROWWISE_NAMES = {"o_proj", "down_proj", "out_proj", "fc2", "w2", "c_proj", "dense_4h_to_h", "wo"}
_LM_HEAD_NAMES = {"lm_head", "embed_out", "output"}


@dataclass(frozen=True)
class Placement:
    """How one module is split: its style, how many packed segments its split dim holds, whether
    it is in Conv1D layout (``[in, out]``) and where the choice came from."""

    style: str
    fused: int = 1
    transposed: bool = False
    source: str = "rules"


def is_conv1d(module: nn.Module) -> bool:
    # transformers' Conv1D (GPT-2): weight [in, out]; matched by name to keep transformers lazy.
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf") and hasattr(module, "nx")


def is_linear(module: nn.Module) -> bool:
    return isinstance(module, nn.Linear) or is_conv1d(module)


def _hf_pattern(key: str) -> re.Pattern[str]:
    return re.compile("^" + re.escape(key).replace(r"\*", r"[^.]+") + "$")


def _model_tp_plan(model: nn.Module) -> dict[str, str]:
    plan = getattr(model, "tp_plan", None)
    if isinstance(plan, Mapping) and plan:
        return dict(plan)
    config = getattr(model, "config", None)
    base = getattr(config, "base_model_tp_plan", None)
    if isinstance(base, Mapping) and base:
        prefix = getattr(model, "base_model_prefix", "")
        inner = getattr(model, prefix, None) if prefix else None
        if isinstance(inner, nn.Module) and inner is not model:
            return {f"{prefix}.{k}": v for k, v in base.items()}
        return dict(base)
    return {}


class _SpecMatcher:
    """A layer spec's patterns matched as it defines them (against the parameter name,
    ``<module>.weight``) or against the module name, whichever the pattern was written for."""

    def __init__(self, spec: Any, model_type: str | None) -> None:
        self.spec, self.model_type = spec, model_type

    def search(self, name: str) -> bool:
        t = self.model_type
        return bool(self.spec.matches(name + ".weight", t) or self.spec.matches(name, t))


def spec_style(spec: Any) -> tuple[str, int]:
    """(style, packed segments) of a :class:`~ds.parallel.tp.specs.TPLayerSpec`."""
    kind = spec.partition_type.value
    if kind == "skip":
        return (REPLICATE_GRAD_ALLREDUCE if spec.grad_allreduce else REPLICATE), 1
    fused = spec.get_num_sub_params() or 1
    if spec.has_unequal_sub_params():
        raise ConfigError(
            f"partition_config {spec.patterns}: segments of unequal sizes {spec.shape} are not "
            "supported by ds AutoTP; split the fused weight into separate modules"
        )
    if kind == "row":
        return ROWWISE, 1
    return (COLWISE_GATHER if spec.gather_output else COLWISE), fused


def normalize_partition_config(
    config: Any, model_type: str | None = None
) -> list[tuple[Any, tuple[str, int]]]:
    """``{regex: style}``, a list of pairs, DeepSpeed's ``{"layer_specs": [{"patterns": [...],
    "partition_type": "column"|"row"|"skip"}]}`` or an :class:`~ds.parallel.tp.specs.AutoTPConfig`,
    as (matcher, (style, packed segments)) pairs in priority order."""
    if config is None:
        return []
    from .specs import as_autotp_config

    specs = as_autotp_config(config)
    if specs is not None:
        return [(_SpecMatcher(s, model_type), spec_style(s)) for s in specs.layer_specs]
    if isinstance(config, Mapping):
        pairs = [(str(k), v) for k, v in config.items()]
    else:
        pairs = [(str(k), v) for k, v in config]
    out: list[tuple[Any, tuple[str, int]]] = []
    for pat, style in pairs:
        if not isinstance(style, str) or style.lower() not in _HF_STYLES:
            raise ConfigError(
                f"partition_config[{pat!r}] = {style!r} is not a known style; "
                f"use 'colwise', 'rowwise' or 'replicate'"
            )
        try:
            out.append((re.compile(pat), _HF_STYLES[style.lower()]))
        except re.error as e:
            raise ConfigError(f"partition_config key {pat!r} is not a valid regex ({e})") from e
    return out


def _vocab_size(model: nn.Module) -> int | None:
    config = getattr(model, "config", None)
    size = getattr(config, "vocab_size", None)
    return size if isinstance(size, int) else None


def _rule(name: str, module: nn.Module, vocab: int | None) -> tuple[str, int] | None:
    leaf = name.rsplit(".", 1)[-1]
    if isinstance(module, nn.Embedding):
        if vocab is not None and module.num_embeddings == vocab:
            return VOCAB_EMBEDDING, 1
        return REPLICATE, 1  # position and type embeddings stay whole
    out_features = module.nf if is_conv1d(module) else getattr(module, "out_features", None)
    if leaf in _LM_HEAD_NAMES:
        return COLWISE_GATHER, 1
    if leaf == "c_attn" and is_conv1d(module):
        return COLWISE, 3  # GPT-2's fused q,k,v: each split by heads
    if leaf in ("qkv_proj", "query_key_value", "Wqkv"):
        return None  # fused layouts differ per model: only a tp_plan or partition_config places it
    if leaf == "gate_up_proj":
        return COLWISE, 2
    if leaf in _COLWISE_NAMES:
        return COLWISE, 1
    if leaf in _ROWWISE_NAMES:
        return ROWWISE, 1
    if vocab is not None and out_features == vocab:
        return COLWISE_GATHER, 1  # a head onto the vocabulary under another name
    return None


def plan_for(
    model: nn.Module, partition_config: Any = None, whole: Sequence[str] = ()
) -> dict[str, Placement]:
    """The placement of every linear and embedding module (and of modules the model's plan marks
    replicated-with-gradient-all-reduce), keyed by module name. ``whole``: module names (and
    their children) left unsplit whatever the plans say (the MoE blocks expert parallelism
    distributes). Pure: changes nothing."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    user = normalize_partition_config(partition_config, model_type)
    hf = [(k, _hf_pattern(k), v) for k, v in _model_tp_plan(model).items()]
    vocab = _vocab_size(model)
    plan: dict[str, Placement] = {}
    unplaced: list[str] = []
    kept = tuple(whole)
    for name, module in model.named_modules():
        if not name or any(name == k or name.startswith(k + ".") for k in kept):
            continue
        candidate = is_linear(module) or isinstance(module, nn.Embedding)
        choice: tuple[str, int] | None = None
        source = ""
        for matcher, placed in user:
            if matcher.search(name):
                choice, source = placed, "partition_config"
                break
        if choice is None:
            for key, pat, style in hf:
                if pat.match(name):
                    if style not in _HF_STYLES:
                        raise ConfigError(
                            f"module {name!r}: the model's tp_plan style {style!r} ({key!r}) is "
                            f"not supported by ds AutoTP; override it with partition_config="
                            f"{{{name.rsplit('.', 1)[-1] + '$'!r}: 'colwise'|'rowwise'|'replicate'}}"
                        )
                    choice, source = _HF_STYLES[style], "tp_plan"
                    break
        if choice is None and candidate:
            choice, source = _rule(name, module, vocab), "rules"
        if choice is None:
            if candidate and is_linear(module):
                unplaced.append(name)
            continue
        style, fused = choice
        if not candidate and style in SHARDED:
            continue  # a plan entry for a container: its linear children carry their own
        if isinstance(module, nn.Embedding):
            if style == ROWWISE:
                style = VOCAB_EMBEDDING  # torch's RowwiseParallel on an embedding splits the rows
            elif style in (COLWISE, COLWISE_GATHER):
                raise ConfigError(
                    f"module {name!r}: splitting an embedding's hidden dim ({style}) is not "
                    f"supported; use 'embedding_rowwise' (vocab-parallel) or 'replicate'"
                )
        elif style == VOCAB_EMBEDDING:
            style = ROWWISE
        plan[name] = Placement(style, fused, is_conv1d(module), source)
    if unplaced:
        more = f" (and {len(unplaced) - 1} more)" if len(unplaced) > 1 else ""
        raise ConfigError(
            f"AutoTP cannot place module {unplaced[0]!r}{more}: no tp_plan entry or name rule "
            f"matches it; pass partition_config={{{unplaced[0].rsplit('.', 1)[-1] + '$'!r}: "
            f"'colwise'|'rowwise'|'replicate'}}"
        )
    return plan


__all__ = [
    "COLWISE",
    "COLWISE_GATHER",
    "REPLICATE",
    "REPLICATE_GRAD_ALLREDUCE",
    "ROWWISE",
    "SHARDED",
    "VOCAB_EMBEDDING",
    "Placement",
    "is_conv1d",
    "is_linear",
    "normalize_partition_config",
    "plan_for",
    "spec_style",
]
