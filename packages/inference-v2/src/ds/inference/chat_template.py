"""Chat templates: the model's Jinja template rendered the way transformers' apply_chat_template
renders it (sandboxed, trim_blocks/lstrip_blocks, ``raise_exception``, ``tojson``,
``strftime_now``, the tokenizer's special tokens as variables).

The template comes from ``--chat-template`` (a file or the template text), else
``chat_template.jinja`` / ``chat_template.json`` / ``tokenizer_config.json`` of the tokenizer
directory. The rendered text is tokenized without adding special tokens, as transformers does:
the template writes the BOS token itself where the model wants one.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from ds.interfaces.errors import ConfigError, InferenceError


class TemplateError(InferenceError):
    """The template refused the conversation (its ``raise_exception``) or failed to render."""


def _token_text(value: Any) -> str | None:
    # tokenizer_config.json stores special tokens as strings or serialized AddedToken dicts.
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def read_tokenizer_config(directory: Path) -> dict[str, Any]:
    file = directory / "tokenizer_config.json"
    if not file.is_file():
        return {}
    try:
        data = json.loads(file.read_text())
    except ValueError as exc:
        raise ConfigError(f"{file} is not valid JSON: {exc}") from exc
    return data if isinstance(data, dict) else {}


def special_tokens(tokenizer_config: dict[str, Any]) -> dict[str, str]:
    out = {}
    for name in ("bos_token", "eos_token", "unk_token", "pad_token"):
        text = _token_text(tokenizer_config.get(name))
        if text is not None:
            out[name] = text
    return out


def find_template(directory: Path | None, tokenizer_config: dict[str, Any]) -> str | None:
    """The default chat template of a tokenizer directory, or None."""
    if directory is not None:
        jinja = directory / "chat_template.jinja"
        if jinja.is_file():
            return jinja.read_text()
        js = directory / "chat_template.json"
        if js.is_file():
            value = json.loads(js.read_text()).get("chat_template")
            if isinstance(value, str):
                return value
    value = tokenizer_config.get("chat_template")
    if isinstance(value, list):  # named templates: [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("default")
    return value if isinstance(value, str) else None


def load_override(spec: str) -> str:
    """``--chat-template``: a path to a template file, or the template text itself."""
    path = Path(spec)
    try:
        if path.is_file():
            return path.read_text()
    except OSError:
        pass  # a long template string is not a path
    if "{" not in spec:
        raise ConfigError(
            f"--chat-template {spec!r} is neither a file nor a Jinja template (no '{{' in it)"
        )
    return spec


@lru_cache(maxsize=8)
def _compile(template: str) -> Any:
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(f"the chat template refused the conversation: {message}")

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, **kw: Any) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, **kw)

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    try:
        return env.from_string(template)
    except jinja2.TemplateError as exc:
        raise ConfigError(f"the chat template does not parse: {exc}") from exc


@lru_cache(maxsize=8)
def variables(template: str) -> frozenset[str]:
    """The variables the template reads from its context (``messages``, ``tools``, ...)."""
    import jinja2
    from jinja2 import meta
    from jinja2.ext import loopcontrols

    env = jinja2.Environment(extensions=[loopcontrols])
    return frozenset(meta.find_undeclared_variables(env.parse(template)))


def check_template(template: str) -> None:
    _compile(template)


def render(
    template: str,
    messages: list[dict[str, Any]],
    tokens: dict[str, str],
    add_generation_prompt: bool = True,
    **extra: Any,
) -> str:
    import jinja2

    try:
        text: str = _compile(template).render(
            messages=messages, add_generation_prompt=add_generation_prompt, **tokens, **extra
        )
    except TemplateError:
        raise
    except (
        jinja2.TemplateError,
        TypeError,
        ValueError,
        KeyError,
        AttributeError,
        RecursionError,
    ) as exc:
        # The template met a message shape it does not handle.
        raise TemplateError(f"the chat template failed to render: {exc!r}") from exc
    return text
