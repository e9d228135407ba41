"""Ulysses with transformers' attention interface (transformers is imported only when used)."""

from __future__ import annotations

from typing import Any

from ds.interfaces.errors import ConfigError
from ds.parallel.sequence.attention import FLASH_GATHERED_KWARGS, UlyssesAttention


def ulysses_name(core: str) -> str:
    return f"ulysses_{core}"


def register_ulysses_attention(comm: Any, sp_group: Any, core: str = "sdpa") -> str:
    """Register ``ulysses_<core>`` with ``transformers.AttentionInterface`` and return the name.

    ``core`` is any implementation in ``transformers.modeling_utils.ALL_ATTENTION_FUNCTIONS``
    ("sdpa", "flash_attention_2", ...) or "eager". The registry is process-wide, so registering
    again (another group) replaces the earlier function under the same name. No mask function is
    registered for the name, so transformers' models pass ``attention_mask=None`` and the core
    applies its causal mask to the full sequence after the all-to-all (sdpa and flash: their causal
    flag when the mask is None; eager, which has none, gets an additive causal mask built here).
    """
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if core.startswith("ulysses_"):
        raise ConfigError(f"core attention {core!r} is already a Ulysses wrapper; pass its core")
    if core == "eager":
        from transformers.models.llama.modeling_llama import eager_attention_forward as core_fn
    elif core in ALL_ATTENTION_FUNCTIONS:
        core_fn = ALL_ATTENTION_FUNCTIONS[core]
    else:
        known = sorted(k for k in ALL_ATTENTION_FUNCTIONS if not k.startswith("ulysses_"))
        raise ConfigError(
            f"unknown core attention {core!r} for Ulysses; use one of {['eager', *known]}"
        )
    gathered = FLASH_GATHERED_KWARGS if core.startswith("flash") else ()
    name = ulysses_name(core)
    wrapper = UlyssesAttention(core_fn, comm, sp_group, gathered, causal_mask=core == "eager")
    AttentionInterface.register(name, wrapper)
    return name


def use_ulysses_attention(model: Any, comm: Any, sp_group: Any, core: str | None = None) -> str:
    """Register Ulysses around ``core`` (default: the model's current implementation) and switch
    ``model`` to it; the model's head counts are checked first. Returns the registered name."""
    from ds.parallel.sequence.heads import check_model_config

    check_model_config(model.config, int(comm.get_world_size(sp_group)))
    current = model.config._attn_implementation
    if core is None:
        core = current.removeprefix("ulysses_") if current else "sdpa"
    name = register_ulysses_attention(comm, sp_group, core)
    setter = getattr(model, "set_attn_implementation", None)
    if callable(setter):
        setter(name)
    else:  # transformers 4.x before the public setter
        model.config._attn_implementation = name
    if model.config._attn_implementation != name:
        raise ConfigError(
            f"{type(model).__name__} kept attention implementation "
            f"{model.config._attn_implementation!r} instead of {name!r}: it does not dispatch "
            "through transformers' AttentionInterface, so Ulysses cannot wrap its attention"
        )
    return name


__all__ = ["register_ulysses_attention", "ulysses_name", "use_ulysses_attention"]
