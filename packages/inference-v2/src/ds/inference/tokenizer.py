"""Text <-> token ids for the server: ``tokenizer.json`` plus the chat template and special
tokens of ``tokenizer_config.json``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ds.inference import chat_template as ct
from ds.interfaces.errors import InferenceError


def _fallback_transcript(messages: list[dict[str, Any]]) -> str:
    # For tokenizers without a chat template: a plain role-tagged transcript.
    lines = [f"{m.get('role', 'user')}: {m.get('content') or ''}" for m in messages]
    return "\n".join([*lines, "assistant:"])


class TextCodec:
    def __init__(
        self,
        tokenizer: Any | None,
        chat_template: str | None = None,
        special: dict[str, str] | None = None,
        path: Path | None = None,
    ) -> None:
        self._tok = tokenizer
        self.chat_template = chat_template
        self.special = dict(special or {})
        self.path = path  # the tokenizer directory (for grammar compilation)
        if chat_template is not None:
            ct.check_template(chat_template)

    @classmethod
    def from_dir(cls, path: str | Path | None, chat_template: str | None = None) -> TextCodec:
        """The tokenizer of a model (or tokenizer) directory; ``chat_template`` overrides the
        directory's own (a file path or the template text)."""
        override = ct.load_override(chat_template) if chat_template else None
        if path is None:
            return cls(None, override)
        root = Path(path)
        file = root / "tokenizer.json"
        if not file.is_file():
            return cls(None, override)
        from tokenizers import Tokenizer

        config = ct.read_tokenizer_config(root)
        template = override or ct.find_template(root, config)
        return cls(Tokenizer.from_file(str(file)), template, ct.special_tokens(config), root)

    @property
    def uses_tools(self) -> bool:
        """The chat template renders a ``tools`` variable (transformers' ``tools=``)."""
        return self.chat_template is not None and "tools" in ct.variables(self.chat_template)

    @property
    def available(self) -> bool:
        return self._tok is not None

    def _need(self) -> Any:
        if self._tok is None:
            raise InferenceError(
                "this model directory has no tokenizer.json, so text prompts cannot be encoded; "
                "send the prompt as a list of token ids (or pass --tokenizer DIR)"
            )
        return self._tok

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; special tokens (BOS) are added as tokenizer.json's post
        processor defines, like transformers' ``tokenizer(text)``.

        Encoded through ``encode_batch``, which releases the GIL (``encode`` holds it): a huge
        prompt tokenized on a worker thread then does not stall the engine thread's streams."""
        batch = self._need().encode_batch([text], add_special_tokens=add_special_tokens)
        ids: list[int] = batch[0].ids
        return ids

    def decode(self, ids: list[int]) -> str:
        if self._tok is None:
            return ""
        text: str = self._tok.decode(ids, skip_special_tokens=True)
        return text

    def token_text(self, token: int) -> str:
        """One token's text as logprobs report it."""
        if self._tok is None:
            return f"token_id:{token}"
        text = self._tok.decode([token], skip_special_tokens=False)
        return str(text)

    def chat_prompt(self, messages: list[dict[str, Any]], **extra: Any) -> str:
        """The rendered prompt text of a conversation (no generation yet); ``extra`` are
        template variables (``tools=...``), as apply_chat_template's keyword arguments."""
        if self.chat_template is None:
            return _fallback_transcript(messages)
        return ct.render(self.chat_template, messages, self.special, **extra)

    def chat_ids(
        self, messages: list[dict[str, Any]], add_special_tokens: bool = False, **extra: Any
    ) -> list[int]:
        """Token ids of a conversation: the template's text tokenized without added special
        tokens (the template writes BOS itself), as apply_chat_template(tokenize=True)."""
        if self.chat_template is None:
            return self.encode(_fallback_transcript(messages))
        return self.encode(self.chat_prompt(messages, **extra), add_special_tokens)
