"""Text <-> token ids for the server, from the model directory's ``tokenizer.json``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ds.interfaces.errors import InferenceError


class TextCodec:
    def __init__(self, tokenizer: Any | None, chat_template: str | None = None) -> None:
        self._tok = tokenizer
        self.chat_template = chat_template

    @classmethod
    def from_dir(cls, path: str | Path | None) -> TextCodec:
        if path is None:
            return cls(None)
        file = Path(path) / "tokenizer.json"
        if not file.is_file():
            return cls(None)
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_file(str(file)))

    @property
    def available(self) -> bool:
        return self._tok is not None

    def encode(self, text: str) -> list[int]:
        if self._tok is None:
            raise InferenceError(
                "this model directory has no tokenizer.json, so text prompts cannot be encoded; "
                "send the prompt as a list of token ids"
            )
        ids: list[int] = self._tok.encode(text, add_special_tokens=False).ids
        return ids

    def decode(self, ids: list[int]) -> str:
        if self._tok is None:
            return ""
        text: str = self._tok.decode(ids, skip_special_tokens=True)
        return text

    def chat_prompt(self, messages: list[dict[str, str]]) -> str:
        # A plain role-tagged transcript; models with their own chat format get it from the
        # client side (completions endpoint) until templates are rendered here.
        lines = [f"{m.get('role', 'user')}: {m.get('content', '')}" for m in messages]
        return "\n".join([*lines, "assistant:"])
