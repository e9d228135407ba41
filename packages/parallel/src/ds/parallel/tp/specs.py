"""Layer specs for tensor parallelism: which parameters split along which dimension.

A :class:`TPLayerSpec` names parameters by regex (matched from the start of the parameter name,
``model.layers.0.self_attn.q_proj.weight``) and says how they split: ``COLUMN`` (output features;
``gather_output`` all-gathers the result, as for an LM head), ``ROW`` (input features, output
all-reduced) or ``SKIP`` (left whole; ``grad_allreduce`` sums its gradient over the group). An
:class:`AutoTPConfig` is an ordered list of them, the first match wins. This is DeepSpeed's
``partition_config`` format (``{"layer_specs": [{"patterns": [...], "partition_type": "row"}]}``);
:func:`ds.parallel.tp.plan_for` accepts either form.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from ds.interfaces.errors import ConfigError
from ds.interfaces.logging import get_logger

log = get_logger(__name__)


class PartitionType(Enum):
    COLUMN = "column"  # output dim split; input gradient all-reduced
    ROW = "row"  # input dim split; output all-reduced
    SKIP = "skip"  # not split


def _tuplify(shape: Any) -> Any:
    # JSON gives lists; a nested list at the partition dim lists unequal segment sizes.
    if isinstance(shape, list | tuple):
        return tuple(_tuplify(s) for s in shape)
    return shape


@dataclass
class TPLayerSpec:
    """How the parameters matching ``patterns`` split. ``shape`` views the weight as packed
    segments before splitting: ``(3, -1)`` three equal ones (fused q,k,v), ``((q, k, v), -1)``
    unequal ones; ``partition_dim`` defaults to 0 for COLUMN and 1 for ROW."""

    patterns: list[str]
    partition_type: PartitionType = PartitionType.COLUMN
    shape: tuple[Any, ...] | None = None
    partition_dim: int | None = None
    model_types: list[str] | None = None
    gather_output: bool = False
    grad_allreduce: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.partition_type, str):
            self.partition_type = PartitionType(self.partition_type.lower())
        if self.shape is not None:
            self.shape = _tuplify(self.shape)
            self._check_shape()

    def _check_shape(self) -> None:
        shape, dim = self.shape, self.get_partition_dim()
        if not isinstance(shape, tuple):
            raise ValueError("AutoTP shape must be a tuple of ints, with a tuple at partition_dim")
        if not 0 <= dim < len(shape):
            raise ValueError(f"AutoTP partition_dim {dim} is out of range for shape {shape}")
        for i, d in enumerate(shape):
            if isinstance(d, tuple):
                if i != dim:
                    raise ValueError(
                        f"AutoTP shape {shape}: a tuple of segment sizes may only stand at "
                        f"partition_dim={dim}, not at {i}"
                    )
                if not d or not all(isinstance(v, int) and v > 0 for v in d):
                    raise ValueError(
                        f"AutoTP shape {shape}: segment sizes must be positive integers "
                        "(one level of nesting only)"
                    )
            elif not isinstance(d, int) or d == 0 or d < -1:
                raise ValueError(f"AutoTP shape {shape}: dimensions are positive integers or -1")

    def get_partition_dim(self) -> int:
        if self.partition_dim is not None:
            return self.partition_dim
        return 0 if self.partition_type == PartitionType.COLUMN else 1

    def has_unequal_sub_params(self) -> bool:
        return self.get_sub_param_sizes() is not None

    def get_sub_param_sizes(self) -> tuple[int, ...] | None:
        dim = self.get_partition_dim()
        if self.shape is None or dim >= len(self.shape) or not isinstance(self.shape[dim], tuple):
            return None
        return self.shape[dim]  # type: ignore[no-any-return]

    def get_num_sub_params(self) -> int | None:
        dim = self.get_partition_dim()
        if self.shape is None or dim >= len(self.shape):
            return None
        d = self.shape[dim]
        if isinstance(d, tuple):
            return len(d)
        return d if isinstance(d, int) and d > 0 else None

    def matches(self, param_name: str, model_type: str | None = None) -> bool:
        if self.model_types:
            if model_type is None:
                return False
            if str(model_type).lower() not in {str(t).lower() for t in self.model_types}:
                return False
        return any(re.match(p, param_name) for p in self.patterns)


@dataclass
class AutoTPConfig:
    """An ordered list of layer specs (first match wins) and the TP size they are for."""

    tp_size: int = 1
    layer_specs: list[TPLayerSpec] = field(default_factory=list)
    embedding_partition_dim: int = 1
    lm_head_patterns: list[str] = field(default_factory=lambda: ["lm_head", "embed_out"])
    use_default_specs: bool = True
    strict_mode: bool = False  # a linear layer no spec matches is an error

    def find_matching_spec(
        self, param_name: str, model_type: str | None = None
    ) -> TPLayerSpec | None:
        hits = [s for s in self.layer_specs if s.matches(param_name, model_type)]
        if len(hits) > 1:
            log.warning("autotp_spec_ambiguous", param=param_name, using=hits[0].patterns)
        return hits[0] if hits else None

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> AutoTPConfig:
        specs = []
        for s in config.get("layer_specs", []):
            kind = s.get("partition_type", "column")
            specs.append(
                TPLayerSpec(
                    patterns=list(s.get("patterns", [])),
                    partition_type=PartitionType(kind.lower()) if isinstance(kind, str) else kind,
                    shape=_tuplify(s["shape"]) if s.get("shape") is not None else None,
                    partition_dim=s.get("partition_dim"),
                    model_types=s.get("model_types"),
                    gather_output=bool(s.get("gather_output", False)),
                    grad_allreduce=bool(s.get("grad_allreduce", False)),
                )
            )
        return cls(
            tp_size=config.get("tp_size", 1),
            layer_specs=specs,
            embedding_partition_dim=config.get("embedding_partition_dim", 1),
            lm_head_patterns=list(config.get("lm_head_patterns", ["lm_head", "embed_out"])),
            use_default_specs=config.get("use_default_specs", True),
            strict_mode=config.get("strict_mode", False),
        )


def merge_autotp_configs(base: AutoTPConfig, override: AutoTPConfig) -> AutoTPConfig:
    """``override``'s specs first (they win), then ``base``'s."""
    return AutoTPConfig(
        tp_size=override.tp_size if override.tp_size > 1 else base.tp_size,
        layer_specs=list(override.layer_specs) + list(base.layer_specs),
        embedding_partition_dim=override.embedding_partition_dim,
        lm_head_patterns=override.lm_head_patterns or base.lm_head_patterns,
        use_default_specs=override.use_default_specs,
        strict_mode=override.strict_mode,
    )


_C, _R, _S = PartitionType.COLUMN, PartitionType.ROW, PartitionType.SKIP
_LLAMA = (
    (r".*\.self_attn\.o_proj\.weight$", _R, None),
    (r".*\.self_attn\.[qkv]_proj\.weight$", _C, None),
    (r".*\.mlp\.down_proj\.weight$", _R, None),
    (r".*\.mlp\.(up|gate)_proj\.weight$", _C, None),
)
_GLM_LIKE = (
    (r".*\.self_attention\.dense\.weight$", _R, None),
    (r".*\.mlp\.dense_4h_to_h\.weight$", _R, None),
)
# Built-in spec tables for common architectures: (pattern, partition type, packed shape).
_PRESETS: dict[str, tuple[tuple[str, PartitionType, tuple[Any, ...] | None], ...]] = {
    "llama": _LLAMA,
    "qwen2": _LLAMA,
    "bloom": _GLM_LIKE
    + (
        (r".*\.self_attention\.query_key_value\.weight$", _C, None),  # heads interleaved
        (r".*\.mlp\.dense_h_to_4h\.weight$", _C, None),
    ),
    "chatglm": _GLM_LIKE
    + (
        (r".*\.self_attention\.query_key_value\.weight$", _C, (3, -1)),
        (r".*\.mlp\.dense_h_to_4h\.weight$", _C, (2, -1)),
    ),
    "phi3": (
        (r".*\.self_attn\.o_proj\.weight$", _R, None),
        (r".*\.self_attn\.qkv_proj\.weight$", _C, (3, -1)),
        (r".*\.mlp\.down_proj\.weight$", _R, None),
        (r".*\.mlp\.gate_up_proj\.weight$", _C, (2, -1)),
    ),
    "mixtral": _LLAMA[:2]
    + (
        (r".*\.block_sparse_moe\.experts\.\d+\.w2\.weight$", _R, None),
        (r".*\.block_sparse_moe\.experts\.\d+\.w[13]\.weight$", _C, None),
        (r".*\.block_sparse_moe\.gate\.weight$", _S, None),
    ),
    "deepseek_v2": (
        (r".*\.self_attn\.o_proj\.weight$", _R, None),
        (r".*\.self_attn\.(q_a_proj|kv_a_proj_with_mqa)\.weight$", _S, None),  # low-rank latents
        (r".*\.self_attn\.(q_b_proj|kv_b_proj)\.weight$", _C, None),
        (r".*\.mlp\.experts\.\d+\.down_proj\.weight$", _R, None),
        (r".*\.mlp\.experts\.\d+\.(up|gate)_proj\.weight$", _C, None),
        (r".*\.mlp\.gate\.weight$", _S, None),
        (r".*\.mlp\.shared_experts\.down_proj\.weight$", _R, None),
        (r".*\.mlp\.shared_experts\.(up|gate)_proj\.weight$", _C, None),
    ),
}


def preset(model_type: str) -> AutoTPConfig | None:
    """The built-in specs for ``model_type`` (``llama``, ``qwen2``, ``mixtral``, ``phi3``,
    ``bloom``, ``chatglm``, ``deepseek_v2``), or None."""
    table = _PRESETS.get(model_type.lower())
    if table is None:
        return None
    specs = [
        TPLayerSpec(patterns=[p], partition_type=t, shape=s, partition_dim=0 if s else None)
        for p, t, s in table
    ]
    return AutoTPConfig(layer_specs=specs)


def as_autotp_config(config: Any) -> AutoTPConfig | None:
    """An AutoTPConfig from one, from DeepSpeed's ``{"layer_specs": [...]}`` dict, or None."""
    if isinstance(config, AutoTPConfig):
        return config
    if isinstance(config, Mapping) and "layer_specs" in config:
        try:
            return AutoTPConfig.from_dict(config)
        except (ValueError, TypeError, AttributeError) as e:
            raise ConfigError(
                f"tensor_parallel.partition_config: {e}; each layer spec is {{'patterns': "
                "[regex, ...], 'partition_type': 'column'|'row'|'skip'}"
            ) from e
    return None


__all__ = [
    "AutoTPConfig",
    "PartitionType",
    "TPLayerSpec",
    "as_autotp_config",
    "merge_autotp_configs",
    "preset",
]
