"""The ragged inference engine: state manager + blocked KV cache + a model family."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ds.inference.allocator import BlockAllocator
from ds.inference.config import EngineConfig
from ds.inference.gguf_file import is_gguf, open_gguf, read_gguf
from ds.inference.kv_cache import KVCache, bytes_per_block, resolve_num_blocks
from ds.inference.models.loader import family_for, from_module, read_config, read_weights
from ds.inference.ragged import build_ragged_batch, logit_layout
from ds.inference.state import StateManager
from ds.interfaces.errors import ConfigError, InferenceError
from ds.interfaces.inference import Capacity
from ds.interfaces.logging import get_logger

log = get_logger(__name__)

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Without an explicit size the cache holds this many full-length sequences.
_DEFAULT_FULL_SEQUENCES = 8


class InferenceEngineV2:
    """Implements :class:`ds.interfaces.inference.InferenceEngine` over one model."""

    # The paged attention the model runs ("torch" or "triton"), as build_engine resolved it.
    attention: str = "torch"

    def __init__(
        self,
        model: Any,
        config: EngineConfig,
        model_config: dict[str, Any],
        eos_token_ids: Sequence[int] | None = None,
    ) -> None:
        self.model = model
        self.config = config
        self.model_config = model_config
        self.max_context = _max_context(config, model_config, getattr(model, "max_context", None))
        # The state manager enforces the same per-sequence limit the server advertises.
        sm_config = config.state_manager.model_copy(update={"max_context": self.max_context})
        # Where generation ends unless a request sets ignore_eos (the scheduler's choice).
        self.eos_token_ids: tuple[int, ...] = tuple(
            sorted(
                _ids(model_config.get("eos_token_id"))
                if eos_token_ids is None
                else set(eos_token_ids)
            )
        )
        kv = config.kv_cache
        kv_dtype = _DTYPES[kv.dtype] if kv.dtype else model.dtype
        per_block = bytes_per_block(
            model.num_layers, model.num_kv_heads, model.head_dim, kv.block_size, kv_dtype
        )
        default_tokens = self.max_context * _DEFAULT_FULL_SEQUENCES
        num_blocks = resolve_num_blocks(kv, per_block, default_tokens)
        self.block_size = kv.block_size
        self.cache = KVCache(
            model.num_layers,
            num_blocks,
            kv.block_size,
            model.num_kv_heads,
            model.head_dim,
            kv_dtype,
            config.device,
        )
        self.allocator = BlockAllocator(num_blocks)
        self.state = StateManager(sm_config, self.allocator, kv.block_size, config.prefix_caching)
        log.debug("engine built", num_blocks=num_blocks, block_bytes=per_block)

    # -- InferenceEngine protocol -------------------------------------------------------------
    def put(self, uids: Sequence[int], tokens: Sequence[Sequence[int]]) -> torch.Tensor:
        """Run one forward over the new ``tokens`` of each sequence; last-token logits [S, V].

        All-or-nothing: when the batch or the cache cannot take the request, InferenceError is
        raised and no sequence changes.
        """
        return self.put_logits(uids, tokens)[0]

    def put_logits(
        self,
        uids: Sequence[int],
        tokens: Sequence[Sequence[int]],
        all_logits: Sequence[bool] | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
        """:meth:`put`, and for each sequence flagged in ``all_logits`` the logits of every one
        of its new tokens [n_i, V] (row j predicts the token after new token j); None for the
        sequences not flagged. Only flagged sequences pay for the extra rows of the LM head.
        """
        self._validate(uids, tokens)
        if all_logits is not None and len(all_logits) != len(uids):
            raise InferenceError(f"put got {len(uids)} uids but {len(all_logits)} logit flags")
        sm = self.state
        need = 0
        new = 0
        for uid, toks in zip(uids, tokens):
            seq = sm.get(uid)
            seen, held = (seq.seen_tokens, len(seq.blocks)) if seq else (0, 0)
            new += seq is None
            if seen + len(toks) > sm.config.max_context:
                raise InferenceError(
                    f"sequence {uid} would hold {seen + len(toks)} tokens, more than "
                    f"state_manager.max_context={sm.config.max_context}; raise max_context"
                )
            need += sm.blocks_needed(seen, held, len(toks))
        if sm.active_sequences + new > sm.config.max_tracked_sequences:
            raise InferenceError(
                f"{new} new sequences would exceed state_manager.max_tracked_sequences="
                f"{sm.config.max_tracked_sequences}; flush finished sequences first"
            )
        if need > self.allocator.free_blocks:
            raise InferenceError(
                f"KV cache cannot hold the request: {need} blocks needed, "
                f"{self.allocator.free_blocks} free of {self.allocator.num_blocks}; flush "
                "finished sequences, send fewer tokens, or enlarge kv_cache.num_blocks"
            )
        seqs = [sm.get_or_create(uid) for uid in uids]
        for seq, toks in zip(seqs, tokens):
            sm.reserve(seq, len(toks))
        batch = build_ragged_batch(
            tokens,
            [s.seen_tokens for s in seqs],
            [s.blocks for s in seqs],
            self.block_size,
            self.config.device,
            all_logits,
        )
        with torch.inference_mode():
            logits: torch.Tensor = self.model.forward(batch, self.cache)
        for seq, toks in zip(seqs, tokens):
            sm.commit(seq, toks)
        if batch.logit_rows is None:
            return logits, [None] * len(uids)
        assert all_logits is not None
        layout = logit_layout(batch.query_lens, all_logits)
        last = torch.tensor([a + n - 1 for a, n in layout], device=logits.device)
        full = [logits[a : a + n] if f else None for (a, n), f in zip(layout, all_logits)]
        return logits[last], full

    def query(self, uid: int, max_request_tokens: int, max_request_blocks: int) -> tuple[int, int]:
        """How many of ``max_request_tokens`` new tokens ``uid`` can take now, and the blocks
        that costs (never more than ``max_request_blocks`` or the free blocks)."""
        seq = self.state.get(uid)
        seen, held = (seq.seen_tokens, len(seq.blocks)) if seq else (0, 0)
        blocks = min(max_request_blocks, self.allocator.free_blocks)
        room = (held + blocks) * self.block_size - seen
        room = min(room, self.state.config.max_context - seen)
        n = max(0, min(max_request_tokens, room))
        return n, self.state.blocks_needed(seen, held, n)

    def flush(self, uid: int) -> None:
        self.state.flush(uid)

    def capacity(self) -> Capacity:
        return Capacity(
            free_blocks=self.allocator.free_blocks,
            total_blocks=self.allocator.num_blocks,
            block_size=self.block_size,
            active_sequences=self.state.active_sequences,
            max_sequences=self.state.config.max_tracked_sequences,
        )

    # -- extras -------------------------------------------------------------------------------
    def match_prefix(self, uid: int, prompt: Sequence[int]) -> int:
        """Reuse cached blocks for a new sequence's prompt; returns tokens already cached."""
        return self.state.match_prefix(uid, prompt)

    def share_prefix(self, src: int, dst: int, prompt: Sequence[int]) -> int:
        """Give new sequence ``dst`` the cached full blocks of ``src`` that hold a prefix of
        ``prompt`` (shared, not copied); returns the tokens ``dst`` need not recompute."""
        return self.state.share_prefix(src, dst, prompt)

    def seen_tokens(self, uid: int) -> int:
        seq = self.state.get(uid)
        return seq.seen_tokens if seq else 0

    def kv_utilisation(self) -> float:
        """Cached tokens of live sequences / slots of the blocks they hold (1.0 = no waste)."""
        tokens = 0
        blocks: set[int] = set()
        for uid in self.state.uids():
            seq = self.state.get(uid)
            assert seq is not None
            blocks.update(seq.blocks)
            tokens += seq.seen_tokens
        slots = len(blocks) * self.block_size
        return min(1.0, tokens / slots) if slots else 0.0

    def _validate(self, uids: Sequence[int], tokens: Sequence[Sequence[int]]) -> None:
        cfg = self.state.config
        if len(uids) != len(tokens):
            raise InferenceError(f"put got {len(uids)} uids but {len(tokens)} token lists")
        if len(set(uids)) != len(uids):
            raise InferenceError("put got the same uid twice in one batch; merge its tokens")
        if not uids:
            raise InferenceError("put needs at least one sequence")
        if len(uids) > cfg.max_ragged_sequence_count:
            raise InferenceError(
                f"{len(uids)} sequences in one batch exceed state_manager.max_ragged_sequence_count="
                f"{cfg.max_ragged_sequence_count}"
            )
        total = sum(len(t) for t in tokens)
        if total > cfg.max_ragged_batch_size:
            raise InferenceError(
                f"{total} tokens in one batch exceed state_manager.max_ragged_batch_size="
                f"{cfg.max_ragged_batch_size}; split the prompt into chunks"
            )
        vocab = self.model.vocab_size
        for uid, toks in zip(uids, tokens):
            if not toks:
                raise InferenceError(f"sequence {uid} has no new tokens")
            if min(toks) < 0 or max(toks) >= vocab:
                raise InferenceError(f"sequence {uid} has token ids outside [0, {vocab})")


def _max_context(
    config: EngineConfig, model_config: dict[str, Any], model_limit: int | None = None
) -> int:
    if config.max_model_len is not None:
        return config.max_model_len
    limit = config.state_manager.max_context
    if model_limit is None:
        # The family's own reading (rope scaling that extends the trained length) comes first.
        model_limit = model_config.get("max_position_embeddings")
    if isinstance(model_limit, int) and model_limit > 0:
        limit = min(limit, model_limit)
    return limit


def _ids(value: Any) -> set[int]:
    if isinstance(value, bool):
        return set()
    if isinstance(value, int):
        return {value}
    if isinstance(value, (list, tuple)):
        return {v for v in value if isinstance(v, int) and not isinstance(v, bool)}
    return set()


def _generation_eos(path_or_model: str | Path | Any) -> Any:
    if isinstance(path_or_model, (str, Path)):
        file = Path(path_or_model) / "generation_config.json"
        if not file.is_file():
            return None
        try:
            return json.loads(file.read_text()).get("eos_token_id")
        except (OSError, ValueError, AttributeError):
            log.warning(
                "unreadable generation_config.json; its eos_token_id is ignored", path=str(file)
            )
            return None
    gen = getattr(path_or_model, "generation_config", None)
    return getattr(gen, "eos_token_id", None)


def build_engine(
    path_or_model: str | Path | Any,
    config: EngineConfig | dict[str, Any] | None = None,
) -> InferenceEngineV2:
    """An engine for a local Hugging Face directory, a GGUF file or an in-memory
    ``transformers`` model."""
    cfg = EngineConfig.parse(config)
    if isinstance(path_or_model, (str, Path)) and is_gguf(path_or_model):
        model_config = open_gguf(path_or_model).config()
        family = family_for(model_config)
        weights = read_gguf(path_or_model, _DTYPES[cfg.dtype])[1]
    elif isinstance(path_or_model, (str, Path)):
        model_config = read_config(path_or_model)
        family = family_for(model_config)  # before reading weights: fail fast
        weights = read_weights(path_or_model)
    else:
        model_config, weights = from_module(path_or_model)
        family = family_for(model_config)
    linear_factory = None
    if cfg.quantization is not None:
        from ds.inference.quantize import quantized_linear_factory

        linear_factory = quantized_linear_factory(cfg.quantization, cfg.device)
    else:
        from ds.inference.half_linear import half_linear_factory

        # fp16 / fp32 on a CPU: decode-sized inputs through the cpu provider's few-rows linear.
        linear_factory = half_linear_factory(_DTYPES[cfg.dtype], cfg.device)
    model = family(model_config, weights, _DTYPES[cfg.dtype], cfg.device, linear_factory)
    # EOS of config.json and generation_config.json together: transformers' generate() stops on
    # the generation config's, which usually repeats (or extends) the model's.
    eos = _ids(model_config.get("eos_token_id")) | _ids(_generation_eos(path_or_model))
    from ds.inference.attention import cuda_runtime, select_attention

    alibi = getattr(model, "alibi", None) is not None
    decode_kernels = _decode_kernels(cfg, alibi) if cfg.attention in ("auto", "native") else None
    attention = select_attention(
        cfg.attention,
        cfg.device,
        alibi=alibi,
        block_size=cfg.kv_cache.block_size,
        cuda_runtime=cfg.attention != "auto" or cuda_runtime(),
        native_decode=decode_kernels is not None,
    )
    if attention == "triton":
        from ds.inference.triton_attention import paged_attention_triton

        model.attention = paged_attention_triton
    elif attention == "native":
        import functools

        from ds.inference.attention import paged_attention

        assert decode_kernels is not None
        model.attention = functools.partial(
            paged_attention, decode_kernel=decode_kernels.paged_decode_attention
        )
    engine = InferenceEngineV2(model, cfg, model_config, sorted(eos))
    engine.attention = attention  # the implementation "auto" resolved to
    log.debug("paged attention", attention=attention, requested=cfg.attention, device=cfg.device)
    return engine


def _decode_kernels(cfg: EngineConfig, alibi: bool) -> Any:
    """The ``cpu`` kernel provider when it has the paged decode kernel and the engine's model
    fits it (fp32 on a CPU, no ALiBi); None then for ``auto``, a ConfigError for ``native``."""
    from ds.interfaces import registry
    from ds.interfaces.errors import ProviderNotFoundError
    from ds.interfaces.kernels import PagedAttentionKernels

    why = None
    fp32 = cfg.dtype == "float32" and (cfg.kv_cache.dtype or cfg.dtype) == "float32"
    if torch.device(cfg.device).type != "cpu" or not fp32 or alibi:
        why = "it runs fp32 models (and KV caches) without ALiBi on a CPU"
    else:
        try:
            provider = registry.get(registry.KERNELS, "cpu")()
        except ProviderNotFoundError as exc:
            why = f"no cpu kernel provider is installed (pip install ds-ops-kernels): {exc}"
        else:
            if isinstance(provider, PagedAttentionKernels):
                return provider
            why = "the cpu kernel provider has no paged decode kernel"
    if cfg.attention == "native":
        raise ConfigError(
            f"attention 'native' (the CPU paged decode kernel) is not available: {why}"
        )
    return None
