"""The ``expert_parallel`` config section (AutoEP), as DeepSpeed 0.19.8 accepts and checks it.

:func:`parse_autoep_config` reads the JSON section; :func:`validate_autoep_config` checks it
against the job's topology (via :mod:`ds.parallel.moe.folding`) and the value sets of every key;
:func:`validate_autoep_post_detection` checks the expert count of each detected MoE layer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, NoReturn

from ds.interfaces.logging import get_logger

from .folding import build_folding_spec, divisors, validate_folding_global

log = get_logger(__name__)

#: "Not in the config": distinct from an explicit null (``expert_w3: null`` means fused gate+up).
UNSET: Any = type("Unset", (), {"__repr__": lambda self: "UNSET"})()


@dataclass(frozen=True)
class MoEFamily:
    """A MoE model family AutoEP knows: the transformers ``model_type`` values it covers, and
    those it refuses with a note saying what to load instead."""

    description: str
    hf_model_types: tuple[str, ...]
    unsupported_hf_model_type_notes: dict[str, str] = field(default_factory=dict)
    supports_expert_bias: bool = True
    unsupported_router_bias_names: tuple[str, ...] = ()
    # The transformers release whose modeling code (fused expert tensors) AutoEP matches.
    min_transformers_version: str | None = "5.0.0"


#: By preset name (``expert_parallel.preset_model``).
PRESET_MODELS: dict[str, MoEFamily] = {
    "mixtral": MoEFamily("Mixtral: fused experts, softmax top-k", ("mixtral",)),
    "qwen3_moe": MoEFamily(
        "Qwen2-MoE / Qwen3-MoE: fused experts, optional shared expert", ("qwen3_moe", "qwen2_moe")
    ),
    "qwen3_5_moe": MoEFamily(
        "Qwen3.5-MoE text model",
        ("qwen3_5_moe_text",),
        {
            "qwen3_5_moe": "qwen3_5_moe is the multimodal wrapper; load its text model "
            "(model_type qwen3_5_moe_text) for AutoEP"
        },
    ),
    "deepseek_v2": MoEFamily(
        "DeepSeek-V2: expert module list, shared experts",
        ("deepseek_v2",),
        supports_expert_bias=False,
    ),
    "deepseek_v3": MoEFamily("DeepSeek-V3: sigmoid group-limited routing", ("deepseek_v3",)),
}


class FamilyAdapter:
    """Checks that a model fits its family before AutoEP touches it: a refused ``model_type``
    (with its note) and the installed transformers release."""

    def __init__(self, name: str) -> None:
        self.name = name

    def _installed_transformers_version(self) -> str | None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("transformers")
        except PackageNotFoundError:
            return None

    def validate_compatibility(self, model_config: Any) -> None:
        family = PRESET_MODELS[self.name]
        model_type = getattr(model_config, "model_type", None)
        note = family.unsupported_hf_model_type_notes.get(str(model_type))
        if note is not None:
            raise ValueError(f"AutoEP preset {self.name!r}: {note}")
        have, need = self._installed_transformers_version(), family.min_transformers_version
        if have is not None and need is not None and _release(have) < _release(need):
            raise ValueError(
                f"AutoEP preset {self.name!r} matches transformers >= {need}'s modeling code; "
                f"transformers {have} is installed: upgrade it"
            )


def _release(v: str) -> tuple[int, ...]:
    parts = []
    for piece in v.split(".")[:3]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


_ADAPTERS: dict[str, FamilyAdapter] = {}


def family_adapter(name: str) -> FamilyAdapter:
    """The (one) adapter of family ``name``."""
    if name not in PRESET_MODELS:
        raise ValueError(f"unknown AutoEP preset {name!r}; use one of {list(PRESET_MODELS)}")
    return _ADAPTERS.setdefault(name, FamilyAdapter(name))


def preset_name_for_hf_model_type(model_type: str) -> str | None:
    return next((n for n, f in PRESET_MODELS.items() if model_type in f.hf_model_types), None)


def unsupported_preset_for_hf_model_type(model_type: str) -> tuple[str, MoEFamily] | None:
    """The family whose note explains why ``model_type`` is refused, or None."""
    for name, family in PRESET_MODELS.items():
        if model_type in family.unsupported_hf_model_type_notes:
            return name, family
    return None


EXPERT_ACTIVATIONS = ("swiglu", "geglu_tanh", "swiglu_clamped", "swiglu_oai")

_CHOICES = {
    "score_apply": ("auto", "pre", "post"),
    "combine_impl": ("auto", "weighted_sum", "fused_weighted_sum", "legacy_bmm"),
    "row_weighting_impl": ("auto", "eager", "fused"),
    "gate_up_impl": ("separate", "fused"),
    "comm_backend": ("comm", "deepep"),
    "score_func": ("auto", "softmax", "sigmoid"),
}
_NAME_KEYS = (
    "expert_w1",
    "expert_w2",
    "num_experts_attr",
    "top_k_attr",
    "router_pattern",
    "expert_pattern",
    "shared_experts_pattern",
    "shared_experts_gate_pattern",
)


def reject_load_balance_coeff(value: object) -> NoReturn:
    raise ValueError(
        f"load_balance_coeff={value!r} is not supported (auxiliary-loss-free load balancing "
        "through an expert_bias is not implemented); set load_balance_coeff to null or omit "
        "the key"
    )


@dataclass
class AutoEPConfig:
    enabled: bool = False
    autoep_size: int = 1
    expert_tensor_parallel_size: int = 1
    validate_folding_routing: bool = False
    async_split_plan: bool = False
    preset_model: str | None = None
    moe_layer_pattern: str | None = None
    expert_pattern: str | None = None
    router_pattern: str | None = None
    use_grouped_mm: bool = True
    disable_triton_grouped_mm: bool = False
    route_norm: bool | None = None
    route_scale: float = 1.0
    score_apply: str = "auto"
    combine_impl: str = "auto"
    row_weighting_impl: str = "auto"
    gate_up_impl: str = "separate"
    comm_backend: str = "comm"
    comm_num_sm: int = 12
    comm_qp_margin: int = 4
    comm_max_tokens_per_rank: int = 0
    num_expert_groups: int | None = None
    num_limited_groups: int | None = None
    score_func: str = "auto"
    top_k: int | str = "auto"
    load_balance_coeff: Any = UNSET
    routed_scaling_factor: float | str = "auto"
    expert_w1: str | None = None
    expert_w2: str | None = None
    expert_w3: Any = UNSET
    num_experts_attr: str | None = None
    top_k_attr: str | None = None
    has_shared_experts: bool | None = None
    shared_experts_pattern: str | None = None
    shared_experts_gate_pattern: str | None = None
    expert_activation: str | None = None
    # Whether the section named load_balance_coeff at all (only null is accepted).
    _load_balance_coeff_explicit: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        self._load_balance_coeff_explicit = self.load_balance_coeff is not UNSET
        if self.load_balance_coeff is UNSET:
            self.load_balance_coeff = None


@dataclass
class MoELayerSpec:
    """One MoE block AutoEP found in a model: where its router and experts are, how the experts
    are stored (``fused_3d`` tensors or a ``module_list``) and how it routes."""

    moe_module_name: str
    model_family: str
    router_name: str
    experts_name: str
    expert_storage: str  # "fused_3d" | "module_list"
    expert_w1_name: str
    expert_w2_name: str
    expert_w3_name: str | None  # None: gate and up fused in w1
    num_experts: int
    top_k: int
    hidden_size: int
    ffn_hidden_size: int
    score_func: str  # "softmax" | "sigmoid"
    score_apply: str  # "pre" | "post": router weights applied before or after the experts
    route_norm: bool
    gate_bias: bool
    return_router_logits: bool
    router_logits_capture_target: str
    router_logits_capture_index: int | None
    router_logits_capture_layer_name: str | None
    has_shared_experts: bool
    shared_experts_name: str
    shared_experts_gate_name: str = ""
    route_scale: float = 1.0
    num_expert_groups: int | None = None
    num_limited_groups: int | None = None
    group_score_func: str = "top2_sum"
    supports_expert_bias: bool = True
    unsupported_router_bias_names: tuple[str, ...] = ()
    preset_adapter: str = "default"
    router_logits_capture_mode: str = "post_score"
    moe_output_shape: str = "batched"
    e_score_correction_bias_path: str | None = None
    expert_activation: str = "swiglu"
    expert_activation_alpha: float = 1.702
    expert_activation_limit: float = 7.0


_KEYS = tuple(f.name for f in fields(AutoEPConfig) if f.init)


def parse_autoep_config(section: Mapping[str, Any] | None) -> AutoEPConfig:
    """The ``expert_parallel`` section as an AutoEPConfig (defaults for absent keys)."""
    if not section:
        return AutoEPConfig()
    value = section.get("load_balance_coeff")
    if value is not None:
        reject_load_balance_coeff(value)
    return AutoEPConfig(**{k: section[k] for k in _KEYS if k in section})


def _check_choices(config: AutoEPConfig) -> None:
    for key, allowed in _CHOICES.items():
        if getattr(config, key) not in allowed:
            raise ValueError(f"{key} must be one of {allowed}, got {getattr(config, key)!r}")
    for key in ("comm_num_sm", "comm_qp_margin", "comm_max_tokens_per_rank"):
        value, low = getattr(config, key), 1 if key == "comm_num_sm" else 0
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError(f"{key} must be an integer >= {low}, got {value!r}")
    if config.comm_backend == "deepep" and config.comm_max_tokens_per_rank == 0:
        raise ValueError(
            "comm_max_tokens_per_rank must be positive with comm_backend='deepep': the most "
            "tokens one rank routes (micro batch size x padded sequence length)"
        )
    if config.gate_up_impl == "fused" and not config.use_grouped_mm:
        raise ValueError('gate_up_impl="fused" needs use_grouped_mm=true')
    if config.row_weighting_impl == "fused" and (
        config.comm_backend != "deepep" or config.autoep_size == 1
    ):
        raise ValueError(
            'row_weighting_impl="fused" runs only in the DeepEP route: it needs '
            'comm_backend="deepep" and autoep_size > 1'
        )
    if config.expert_activation is not None and config.expert_activation not in EXPERT_ACTIVATIONS:
        raise ValueError(
            f"expert_activation must be one of {EXPERT_ACTIVATIONS}, got {config.expert_activation!r}"
        )
    names = [(k, getattr(config, k)) for k in _NAME_KEYS]
    if config.expert_w3 is not UNSET:
        names.append(("expert_w3", config.expert_w3))
    for key, name in names:
        if name is not None and (not isinstance(name, str) or not name or "." in name):
            raise ValueError(f"{key} must be a direct attribute name (non-empty, no dots)")
    if config.has_shared_experts is not None and not isinstance(config.has_shared_experts, bool):
        raise ValueError("has_shared_experts must be a boolean when set")
    scale = config.routed_scaling_factor
    if scale != "auto" and (not isinstance(scale, int | float) or isinstance(scale, bool)):
        raise ValueError("routed_scaling_factor must be a number or 'auto'")
    groups, limited = config.num_expert_groups, config.num_limited_groups
    for key, n in (("num_expert_groups", groups), ("num_limited_groups", limited)):
        if n is not None and n < 1:
            raise ValueError(f"{key} must be >= 1, got {n}")
    if groups is not None and limited is not None and limited > groups:
        raise ValueError(f"num_limited_groups ({limited}) must be <= num_expert_groups ({groups})")


def validate_autoep_config(
    config: AutoEPConfig,
    world_size: int,
    pp_size: int,
    tp_size: int,
    sp_size: int,
    *,
    zero_stage: int = 0,
    deepcompile_enabled: bool = False,
    tp_preset_model: str | None = None,
    use_data_before_expert_parallel: bool = False,
    mpu: Any = None,
    zero_offload_optimizer: bool = False,
    zero_offload_param: bool = False,
) -> None:
    """ValueError naming the key when the section does not fit the job or its own value sets."""
    if config.load_balance_coeff is not None:
        reject_load_balance_coeff(config.load_balance_coeff)
    for key in ("validate_folding_routing", "async_split_plan"):
        if not isinstance(getattr(config, key), bool):
            raise ValueError(f"expert_parallel.{key} must be a boolean")
    if not config.enabled:
        return
    if config.async_split_plan and config.autoep_size > 1 and tp_size > 1:
        raise ValueError("expert_parallel.async_split_plan does not support AutoEP+AutoTP folding")
    if config.combine_impl == "fused_weighted_sum" and (
        tp_size > 1 or config.expert_tensor_parallel_size > 1 or config.comm_backend == "deepep"
    ):
        raise ValueError(
            'combine_impl="fused_weighted_sum" needs tensor_parallel.autotp_size=1, '
            'expert_tensor_parallel_size=1 and comm_backend="comm"; leave combine_impl unset'
        )
    spec = build_folding_spec(
        world_size=world_size,
        pp_size=pp_size,
        tp_size=max(tp_size, 1),
        ep_size=config.autoep_size,
        etp_size=config.expert_tensor_parallel_size,
        mp_mode="tp" if tp_size > 1 else "sp",
    )
    validate_folding_global(
        spec,
        zero_stage=zero_stage,
        sp_size=sp_size,
        deepcompile_enabled=deepcompile_enabled,
        use_data_before_expert_parallel=use_data_before_expert_parallel,
        mpu=mpu,
        tp_preset=tp_preset_model,
        ep_preset=config.preset_model,
        zero_offload_optimizer=zero_offload_optimizer,
        zero_offload_param=zero_offload_param,
    )
    if config.preset_model is not None and config.preset_model not in PRESET_MODELS:
        raise ValueError(
            f"Unknown preset_model {config.preset_model!r}. Available presets: "
            f"{list(PRESET_MODELS)}"
        )
    _check_choices(config)
    if config.autoep_size == 1:
        log.warning("autoep_size_one", detail="every rank holds all experts; no all-to-all runs")


def validate_autoep_post_detection(config: AutoEPConfig, specs: Sequence[Any]) -> None:
    """Each detected MoE layer (``num_experts``, ``moe_module_name``, optional group counts)
    must split evenly over ``autoep_size`` ranks."""
    if not config.enabled:
        return
    ep = config.autoep_size
    for spec in specs:
        n, name = spec.num_experts, spec.moe_module_name
        if ep > n:
            raise ValueError(
                f"autoep_size={ep} exceeds num_experts={n} in layer {name!r}: each rank must "
                f"own at least one expert. Valid autoep_size values: {divisors(n)}"
            )
        if n % ep:
            raise ValueError(
                f"num_experts={n} in layer {name!r} is not divisible by autoep_size={ep}. "
                f"Valid autoep_size values: {divisors(n)}"
            )
        groups = getattr(spec, "num_expert_groups", None) or config.num_expert_groups
        limited = getattr(spec, "num_limited_groups", None) or config.num_limited_groups
        if groups is None:
            if limited is not None:
                raise ValueError(f"num_limited_groups needs num_expert_groups (layer {name!r})")
            continue
        if n % groups:
            raise ValueError(
                f"num_expert_groups ({groups}) must divide num_experts ({n}) in {name!r}"
            )
        if limited is None or not 1 <= limited <= groups:
            raise ValueError(
                f"num_limited_groups must be set, between 1 and num_expert_groups ({groups}), "
                f"in layer {name!r}; got {limited}"
            )


def fill_autoep_config_from_hf(config: AutoEPConfig, model_config: Any) -> None:
    """Take routing-group counts and the routed scaling factor from a transformers config
    (DeepSeek's ``n_group``, ``topk_group``, ``routed_scaling_factor``) where the section left
    them unset."""
    if model_config is None:
        return
    if config.num_expert_groups is None:
        config.num_expert_groups = getattr(model_config, "n_group", None)
    if config.num_limited_groups is None:
        config.num_limited_groups = getattr(model_config, "topk_group", None)
    if config.routed_scaling_factor == "auto":
        scale = getattr(model_config, "routed_scaling_factor", None)
        if scale is not None:
            config.route_scale = float(scale)


__all__ = [
    "EXPERT_ACTIVATIONS",
    "PRESET_MODELS",
    "UNSET",
    "AutoEPConfig",
    "FamilyAdapter",
    "MoEFamily",
    "MoELayerSpec",
    "family_adapter",
    "fill_autoep_config_from_hf",
    "parse_autoep_config",
    "preset_name_for_hf_model_type",
    "unsupported_preset_for_hf_model_type",
    "reject_load_balance_coeff",
    "validate_autoep_config",
    "validate_autoep_post_detection",
]
