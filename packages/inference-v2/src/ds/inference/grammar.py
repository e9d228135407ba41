"""Structured output (``response_format``): JSON and JSON-schema grammars through xgrammar.

The grammar is compiled once per schema against the tokenizer's vocabulary; each request gets a
matcher that masks the tokens the grammar forbids before sampling and ends the request when the
JSON value is complete. Whitespace between tokens is not free (``any_whitespace=False``) so that a
weak model cannot wander in blanks until ``max_tokens``.

Objects keep the schema's property order (the cache key is the schema as written, not sorted).
xgrammar 0.2.9 lets a string with ``minLength``/``maxLength`` hold raw control characters, which
no JSON parser accepts; such strings are rewritten into the equivalent ``pattern`` (any
character but U+0000-U+001F, the same length bounds) before compiling.
"""

from __future__ import annotations

import json
import re
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
    def __init__(self, compiled: Any, vocab_size: int, until_stop: bool) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        self._m = xgr.GrammarMatcher(compiled, terminate_without_stop_token=not until_stop)
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
    """``until_stop``: the output ends with the model's stop token, which the grammar allows
    once its text may end (free text, further tool calls); otherwise it ends as soon as the
    grammar may (a JSON value)."""

    def __init__(self, compiled: Any, vocab_size: int, until_stop: bool = False) -> None:
        self._compiled = compiled
        self._vocab = vocab_size
        self._until_stop = until_stop

    def matcher(self) -> _Matcher:
        return _Matcher(self._compiled, self._vocab, self._until_stop)


# Keys whose values are literal JSON data, not sub-schemas.
_DATA_KEYS = frozenset({"const", "enum", "default", "examples"})


def without_control_chars(schema: Any) -> Any:
    """``schema`` with every length-bounded string (no pattern or format of its own) given the
    pattern of printable characters of that length, so that its output always parses."""
    if isinstance(schema, list):
        return [without_control_chars(v) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: v if k in _DATA_KEYS else without_control_chars(v) for k, v in schema.items()}
    lo, hi = out.get("minLength", 0), out.get("maxLength", "")
    bounded = "minLength" in out or "maxLength" in out
    plain = "pattern" not in out and "format" not in out and out.get("type") == "string"
    if bounded and plain and isinstance(lo, int) and isinstance(hi, (int, str)):
        out.pop("minLength", None)
        out.pop("maxLength", None)
        out["pattern"] = f"^[^\\x00-\\x1f]{{{lo},{hi}}}$"
    return out


def _key(schema: dict[str, Any]) -> str:
    """The schema as compiled (control characters excluded), in its own order: the cache key."""
    try:
        return json.dumps(without_control_chars(schema))
    except RecursionError:
        raise ConfigError("the schema is nested too deeply to compile") from None


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

    def _compile(self, kind: str, text: str | None) -> CompiledGrammar:
        with self._lock:
            if kind.startswith("tag"):
                compiled = self._compiler.compile_structural_tag(text or "")
            elif text is None:
                compiled = self._compiler.compile_builtin_json_grammar()
            else:
                compiled = self._compiler.compile_json_schema(text, any_whitespace=False)
        return CompiledGrammar(compiled, self._vocab, until_stop=kind == "tag-until-stop")

    def _get(self, kind: str, text: str | None, what: str) -> CompiledGrammar:
        try:
            return self._cached(kind, text)
        except (RuntimeError, ValueError, TypeError) as exc:
            # xgrammar's messages start with "[time] /source/file.cc:line: "
            reason = re.sub(r"^\[[0-9:]+\] \S+?:\d+: ", "", str(exc).strip())
            reason = (reason.splitlines() or [type(exc).__name__])[0]
            raise ConfigError(f"the {what} cannot be compiled: {reason}") from exc

    def __call__(self, schema: dict[str, Any] | None) -> CompiledGrammar:
        """A grammar for any JSON object (``schema`` None) or for a JSON schema."""
        return self._get("schema", None if schema is None else _key(schema), "JSON schema")

    def structural_tag(self, tag: dict[str, Any], until_stop: bool = True) -> CompiledGrammar:
        """A grammar for an xgrammar structural tag (``{"type": "structural_tag", ...}``): free
        text and tagged JSON (tool calls). ``until_stop``: see :class:`CompiledGrammar`."""
        kind = "tag-until-stop" if until_stop else "tag"
        return self._get(kind, _key(tag), "tool schema")


class LazyCompiler:
    """A :class:`GrammarCompiler` built on first use (building walks the whole vocabulary)."""

    def __init__(
        self, tokenizer_dir: Path, vocab_size: int, eos_token_ids: tuple[int, ...]
    ) -> None:
        self._args = (tokenizer_dir, vocab_size, eos_token_ids)
        self._compiler: GrammarCompiler | None = None
        self._lock = threading.Lock()

    def _get(self) -> GrammarCompiler:
        with self._lock:
            if self._compiler is None:
                self._compiler = GrammarCompiler(*self._args)
            return self._compiler

    def __call__(self, schema: dict[str, Any] | None) -> CompiledGrammar:
        return self._get()(schema)

    def structural_tag(self, tag: dict[str, Any], until_stop: bool = True) -> CompiledGrammar:
        return self._get().structural_tag(tag, until_stop)
