"""Validated configuration of the engine: KV cache, state manager, scheduler, quantization."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ds.interfaces.errors import ConfigError

DTypeName = Literal["float32", "float16", "bfloat16"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KVCacheConfig(_Strict):
    """Blocked KV cache: ``block_size`` tokens per block; size from ``num_blocks`` or a byte budget.

    Exactly one of ``num_blocks`` and ``memory_budget_bytes`` sizes the cache; with neither set the
    cache holds ``max_context`` tokens for every tracked sequence.
    """

    block_size: int = Field(default=16, ge=1, le=4096)
    num_blocks: int | None = Field(default=None, ge=1)
    memory_budget_bytes: int | None = Field(default=None, ge=1)
    dtype: DTypeName | None = None  # None: the model's dtype

    @model_validator(mode="after")
    def _one_size(self) -> KVCacheConfig:
        if self.num_blocks is not None and self.memory_budget_bytes is not None:
            raise ConfigError(
                "kv_cache: set either num_blocks or memory_budget_bytes, not both "
                f"(got num_blocks={self.num_blocks}, memory_budget_bytes={self.memory_budget_bytes})"
            )
        return self


class StateManagerConfig(_Strict):
    """Limits of the ragged batch and of the set of tracked sequences."""

    max_tracked_sequences: int = Field(default=256, ge=1)
    max_ragged_batch_size: int = Field(default=768, ge=1)  # tokens per forward
    max_ragged_sequence_count: int = Field(default=128, ge=1)  # sequences per forward
    max_context: int = Field(default=4096, ge=1)  # tokens per sequence


class SchedulerConfig(_Strict):
    """Dynamic SplitFuse: decodes first, then prompt chunks up to ``token_budget`` per forward."""

    token_budget: int = Field(default=512, ge=1)
    chunked_prefill: bool = True
    max_running: int = Field(default=64, ge=1)


class QuantizationConfig(_Strict):
    """Weight-only group-wise quantization of the linear layers through a kernel provider."""

    scheme: Literal["int8_sym", "int4_sym"] = "int8_sym"
    group_size: int = Field(default=64, ge=2)
    # "int8": the activations entering each quantized linear are quantized too, to int8 per
    # block of group_size (integer dot products per group; ds.ops.quant.activations). Opt-in: it
    # changes the outputs by the activations' rounding.
    activations: Literal["float", "int8"] = "float"
    # True: the output head is quantized too, with the same scheme and activations (opt-in: it
    # changes the logits). A head tied to the token embedding gets a quantized copy; the lookup
    # keeps the float table. Off, the head stays in the model dtype.
    lm_head: bool = False
    # None: the provider named for the engine's device type ("cuda" for cuda:N), so weights are
    # quantized and dequantized where they live.
    provider: str | None = None


class EngineConfig(_Strict):
    kv_cache: KVCacheConfig = KVCacheConfig()
    state_manager: StateManagerConfig = StateManagerConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    # On by default: on a workload with no shared prefixes it measured no slower than off
    # (docs/benchmarks.md), and shared prompts skip their cached blocks.
    prefix_caching: bool = True
    dtype: DTypeName = "float32"
    device: str = "cpu"
    # "auto": the Triton paged-attention kernel on CUDA; on a CPU "native" (decode steps through
    # the cpu kernel provider's paged decode kernel) for fp32 models without ALiBi when
    # ds-ops-kernels is installed, else PyTorch (select_attention).
    attention: Literal["auto", "torch", "triton", "native"] = "auto"
    quantization: QuantizationConfig | None = None
    # Tokens per sequence (prompt + output). None: the model's max_position_embeddings, capped by
    # state_manager.max_context; a value here overrides both.
    max_model_len: int | None = Field(default=None, ge=1)

    @classmethod
    def parse(cls, config: EngineConfig | dict[str, object] | None) -> EngineConfig:
        """Accept a model, a dict (DeepSpeed-style nested keys) or None (defaults)."""
        if config is None:
            return cls()
        if isinstance(config, EngineConfig):
            return config
        try:
            return cls.model_validate(config)
        except ConfigError:
            raise
        except Exception as exc:  # pydantic.ValidationError: re-raise in the ds hierarchy
            raise ConfigError(f"invalid inference config: {exc}") from exc
