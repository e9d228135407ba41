"""A tiny random Llama with a real byte-level BPE tokenizer, a chat template and an EOS that greedy
decoding reaches, saved as a Hugging Face directory (no downloads)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

from tiny_models import hf_greedy, tiny_model

VOCAB = 512
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
# Text with multibyte characters so that BPE learns pieces that split UTF-8 sequences.
_CORPUS = [
    'the quick brown fox jumps over the lazy dog {"a": true, "b": [1, 2, 3]}',
    "héllo wörld, ça va? naïve café über straße",
    "日本語のテキスト、中文文本 한국어 텍스트",
    "emoji 🙂🚀✨ and symbols ∑∫√π≈≠ — «quotes»",
    "Ελληνικά κείμενα και русский текст",
] * 20
# Prompt whose greedy continuation decides the EOS token (see make_model_dir).
EOS_PROMPT = "the quick brown fox"


def _tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS, trainer)
    bos = tok.token_to_id("<s>")
    # The BOS the tokenizer adds to plain prompts, as Llama tokenizers do.
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    return tok


def make_model_dir(root: Path, name: str = "tiny-serve") -> Path:
    import transformers

    out = root / name
    tok = _tokenizer()
    hf_tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", chat_template=CHAT_TEMPLATE
    )
    hf_tok.save_pretrained(out)
    model = tiny_model(vocab_size=VOCAB, eos_token_id=None, bos_token_id=tok.token_to_id("<s>"))
    # EOS: the first new token from the 4th on that greedy decoding produces for EOS_PROMPT, so that requests do reach it.
    gen = hf_greedy(model, hf_tok(EOS_PROMPT).input_ids, 16, eos_token_id=None)
    eos = next(t for i, t in enumerate(gen) if i >= 3 and t not in gen[:i])
    model.config.eos_token_id = eos
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = 0
    model.save_pretrained(out, safe_serialization=True)
    # generation_config.json and config.json both carry it, as Hugging Face checkpoints do.
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == eos
    return out


def serve_command() -> list[str]:
    ds = shutil.which("ds", path=str(Path(sys.executable).parent))
    if ds:
        return [ds, "serve"]
    return [sys.executable, "-m", "ds.inference.cli"]  # launcher not installed
