"""Structured output (``response_format``): JSON and JSON-schema grammars through xgrammar.

The grammar is compiled once per schema against the tokenizer's vocabulary; each request gets a
matcher that masks the tokens the grammar forbids before sampling and ends the request when the
JSON value is complete. Whitespace between tokens is not free (``any_whitespace=False``) so that a
weak model cannot wander in blanks until ``max_tokens``.
"""

from __future__ import annotations

import json
import threading
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from ds.interfaces.errors import ConfigError


def available() -> bool:
    try:
        import xgrammar  # noqa: F401
    except ImportError:
        return False
    return True


class _Matcher:
    def __init__(self, compiled: Any, vocab_size: int) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        self._m = xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
        self._mask = xgr.allocate_token_bitmask(1, vocab_size)

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        self._m.fill_next_token_bitmask(self._mask)
        x = logits.float().contiguous().cpu()
        self._xgr.apply_token_bitmask_inplace(x, self._mask)
        return x.to(logits.device)

    def accept(self, token: int) -> None:
        if not self._m.accept_token(token):
            raise ConfigError(f"the grammar refused token {token}")

    def is_terminated(self) -> bool:
        return bool(self._m.is_terminated())


class CompiledGrammar:
    def __init__(self, compiled: Any, vocab_size: int) -> None:
        self._compiled = compiled
        self._vocab = vocab_size

    def matcher(self) -> _Matcher:
        return _Matcher(self._compiled, self._vocab)


class GrammarCompiler:
    """Compiles ``response_format`` schemas for one tokenizer; thread-safe, cached by schema."""

    def __init__(
        self, tokenizer_dir: Path, vocab_size: int, eos_token_ids: tuple[int, ...]
    ) -> None:
        import transformers
        import xgrammar as xgr

        hf = transformers.PreTrainedTokenizerFast(
            tokenizer_file=str(tokenizer_dir / "tokenizer.json")
        )
        info = xgr.TokenizerInfo.from_huggingface(
            hf, vocab_size=vocab_size, stop_token_ids=list(eos_token_ids) or None
        )
        self._compiler = xgr.GrammarCompiler(info)
        self._vocab = vocab_size
        self._lock = threading.Lock()
        self._cached = lru_cache(maxsize=64)(self._compile)

    def _compile(self, schema_json: str | None) -> CompiledGrammar:
        with self._lock:
            if schema_json is None:
                compiled = self._compiler.compile_builtin_json_grammar()
            else:
                compiled = self._compiler.compile_json_schema(schema_json, any_whitespace=False)
        return CompiledGrammar(compiled, self._vocab)

    def __call__(self, schema: dict[str, Any] | None) -> CompiledGrammar:
        """A grammar for any JSON object (``schema`` None) or for a JSON schema."""
        key = None if schema is None else json.dumps(schema, sort_keys=True)
        try:
            return self._cached(key)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise ConfigError(f"the JSON schema cannot be compiled: {exc}") from exc
