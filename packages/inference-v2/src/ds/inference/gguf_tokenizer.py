"""The tokenizer and chat template of a GGUF file, written out as a tokenizer directory
(``tokenizer.json`` + ``tokenizer_config.json``) so the server's codec and grammar compiler read it
as they read any Hugging Face tokenizer.

The vocabulary, merges, token types and special token ids come from the file's
``tokenizer.ggml.*`` metadata; transformers' GGUF converter builds the fast tokenizer from them (it
knows the pre-tokenizer of each llama.cpp ``tokenizer.ggml.pre`` name). BOS is added to encoded
text when the file's ``tokenizer.ggml.add_bos_token`` says so (llama.cpp's default when absent:
yes for sentencepiece vocabularies, no for byte-level BPE).
"""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ds.inference.gguf_file import GGUFCheckpoint, open_gguf
from ds.interfaces.errors import ConfigError

_SPECIAL_IDS = {
    "bos_token": "bos_token_id",
    "eos_token": "eos_token_id",
    "unk_token": "unknown_token_id",
    "pad_token": "padding_token_id",
}


def _converter() -> tuple[dict[str, Any], Any]:
    """transformers' (tokenizer key mapping, converter), wherever this version keeps them."""
    try:
        from transformers.integrations.gguf.gguf_tokenizer_mapping import (
            GGUF_TOKENIZER_MAPPING,
            convert_gguf_tokenizer,
        )
    except ImportError:
        try:
            from transformers.integrations.ggml import convert_gguf_tokenizer
            from transformers.modeling_gguf_pytorch_utils import (
                GGUF_TO_TRANSFORMERS_MAPPING as GGUF_TOKENIZER_MAPPING,
            )
        except ImportError as exc:
            raise ConfigError(
                "building a GGUF file's tokenizer needs transformers: "
                "pip install 'ds-inference-v2[hf]' (or pass --tokenizer DIR)"
            ) from exc
    return dict(GGUF_TOKENIZER_MAPPING["tokenizer"]), convert_gguf_tokenizer


def build_tokenizer(ckpt: GGUFCheckpoint) -> tuple[Any, dict[str, Any]]:
    """A ``tokenizers.Tokenizer`` and the tokenizer_config.json entries of a GGUF file."""
    from tokenizers import processors

    mapping, convert = _converter()
    tokens = ckpt.metadata("tokenizer.ggml.tokens")
    if not tokens:
        raise ConfigError(
            f"{ckpt.path} has no tokenizer (no tokenizer.ggml.tokens); pass --tokenizer DIR"
        )
    fields = {name: ckpt.metadata(f"tokenizer.{key}") for key, name in mapping.items()}
    tokenizer_dict = {k: v for k, v in fields.items() if v is not None}
    try:
        tokenizer, _ = convert(ckpt.architecture, tokenizer_dict)
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{ckpt.path}: cannot build its tokenizer: {exc}") from exc
    config: dict[str, Any] = {}
    for name, key in _SPECIAL_IDS.items():
        index = ckpt.metadata(f"tokenizer.ggml.{key}")
        if index is not None and 0 <= int(index) < len(tokens):
            config[name] = tokens[int(index)]
    template = ckpt.metadata("tokenizer.chat_template")
    if isinstance(template, str):
        config["chat_template"] = template
    add_bos = ckpt.metadata("tokenizer.ggml.add_bos_token")
    if add_bos is None:
        add_bos = tokenizer_dict.get("tokenizer_type") == "llama"
    bos = config.get("bos_token")
    if add_bos and bos is not None:
        bos_id = tokens.index(bos)
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0",
            pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
            special_tokens=[(bos, bos_id)],
        )
    else:
        tokenizer.post_processor = processors.TemplateProcessing(single="$A:0", pair="$A:0 $B:1")
    config["add_bos_token"] = bool(add_bos)
    return tokenizer, config


def write_tokenizer_dir(ckpt: GGUFCheckpoint, directory: str | Path) -> Path:
    """Write the file's tokenizer as ``directory``/tokenizer.json + tokenizer_config.json."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    tokenizer, config = build_tokenizer(ckpt)
    tokenizer.save(str(root / "tokenizer.json"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    (root / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    return root


def tokenizer_dir(path: str | Path) -> Path | None:
    """A temporary tokenizer directory for the GGUF file at ``path`` (removed at exit), or None
    when the file carries no tokenizer (then prompts must be token ids, as for a model
    directory without tokenizer.json)."""
    ckpt = open_gguf(path)
    if not ckpt.metadata("tokenizer.ggml.tokens"):
        return None
    root = Path(tempfile.mkdtemp(prefix="ds-gguf-tokenizer-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return write_tokenizer_dir(ckpt, root)
