"""GGUF checkpoints (llama.cpp's single-file format): the model config from the file's metadata and
the tensors dequantized to float32 under their Hugging Face names.

The container is parsed by ``gguf_parse`` (fast on large vocabularies) and the tensors are
dequantized by the ``gguf`` package llama.cpp publishes. llama.cpp stores the Q and K
projections of ``llama`` models with their rows permuted for its own RoPE layout; the permutation
is undone here so the weights match the Hugging Face layout the model families expect.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ds.inference.gguf_parse import GGUFContainer, GGUFFormatError
from ds.interfaces.errors import ConfigError

# Tensor types this reader dequantizes (ggml type names).
SUPPORTED_TYPES = (
    "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
    "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
)  # fmt: skip
# GGUF ``general.architecture`` -> Hugging Face ``model_type``.
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
# Architectures whose Q/K rows llama.cpp's converter permutes.
_PERMUTED = {"llama"}

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER_RE = re.compile(r"blk\.(\d+)\.([a-z_]+)\.(weight|bias)")
MAGIC = b"GGUF"


def is_gguf(path: str | Path) -> bool:
    """Whether ``path`` names a GGUF file (by its ``.gguf`` suffix or its magic bytes)."""
    p = Path(path)
    if not p.is_file():
        return False
    if p.suffix.lower() == ".gguf":
        return True
    with p.open("rb") as f:
        return f.read(4) == MAGIC


def _gguf() -> Any:
    try:
        import gguf
    except ImportError as exc:
        raise ConfigError(
            "reading a GGUF file needs the gguf package: pip install 'gguf>=0.17'"
        ) from exc
    return gguf


def hf_name(name: str) -> str | None:
    """The Hugging Face name of a llama.cpp tensor name, or None when it has none."""
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    m = _LAYER_RE.fullmatch(name)
    if m is None or m.group(2) not in _LAYER_NAMES:
        return None
    return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.{m.group(3)}"


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's RoPE row permutation of a Q or K projection (weight or bias)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's permutation of a Hugging Face Q or K projection (the inverse of unpermute)."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


class GGUFCheckpoint:
    """One GGUF file: ``metadata(key)``, ``config()`` and ``weights()``."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        gguf = _gguf()
        if not self.path.is_file():
            raise ConfigError(f"{self.path} does not exist; pass a .gguf file or a model directory")
        try:
            self._file = GGUFContainer(self.path)
        except (ValueError, OSError) as exc:
            raise ConfigError(
                f"{self.path} is not a readable GGUF file ({exc}); "
                "it may be truncated or corrupt: download it again"
            ) from exc
        self._types: dict[str, Any] = {}
        for t in self._file.tensors:
            try:
                self._types[t.name] = gguf.GGMLQuantizationType(t.type_id)
            except ValueError:
                raise ConfigError(
                    f"{self.path}: tensor {t.name} has the unknown GGUF type id {t.type_id}; "
                    f"supported: {', '.join(SUPPORTED_TYPES)}"
                ) from None
        self._check_extents()
        arch = self.metadata("general.architecture")
        if arch not in ARCHITECTURES:
            raise ConfigError(
                f"{self.path}: GGUF architecture {arch!r} is not supported; "
                f"supported: {', '.join(ARCHITECTURES)}"
            )
        self.architecture: str = arch

    def _check_extents(self) -> None:
        for t in self._file.tensors:
            try:
                self._file.data(t, self._types[t.name])
            except GGUFFormatError as exc:
                raise ConfigError(f"{self.path} is truncated: {exc}; download it again") from exc

    def metadata(self, key: str, default: Any = None) -> Any:
        """A metadata value (str, number, bool or list), or ``default`` when absent."""
        return self._file.metadata.get(key, default)

    def _arch(self, key: str, default: Any = None) -> Any:
        return self.metadata(f"{self.architecture}.{key}", default)

    def _require(self, key: str) -> Any:
        value = self._arch(key)
        if value is None:
            raise ConfigError(f"{self.path} lacks the metadata key {self.architecture}.{key}")
        return value

    @property
    def tensor_names(self) -> list[str]:
        return [t.name for t in self._file.tensors]

    def config(self) -> dict[str, Any]:
        """A Hugging Face style config.json dictionary for the file's model."""
        hidden = int(self._require("embedding_length"))
        heads = int(self._require("attention.head_count"))
        kv = _uniform(self._arch("attention.head_count_kv", heads), "head_count_kv", self.path)
        head_dim = int(self._arch("attention.key_length", hidden // heads))
        rot = self._arch("rope.dimension_count")
        if rot is not None and int(rot) != head_dim:
            raise ConfigError(
                f"{self.path}: rope.dimension_count {rot} differs from the head size {head_dim}; "
                "partial rotary embeddings are not supported for GGUF files"
            )
        names = set(self.tensor_names)
        embed = self._tensor("token_embd.weight")
        cfg: dict[str, Any] = {
            "model_type": ARCHITECTURES[self.architecture],
            "hidden_size": hidden,
            "intermediate_size": int(self._require("feed_forward_length")),
            "num_hidden_layers": int(self._require("block_count")),
            "num_attention_heads": heads,
            "num_key_value_heads": kv,
            "head_dim": head_dim,
            "rms_norm_eps": float(self._arch("attention.layer_norm_rms_epsilon", 1e-6)),
            "rope_theta": float(self._arch("rope.freq_base", 10000.0)),
            "max_position_embeddings": int(self._arch("context_length", 2048)),
            "vocab_size": int(embed.shape[1]),
            "hidden_act": "silu",
            "tie_word_embeddings": "output.weight" not in names,
            "attention_bias": "blk.0.attn_q.bias" in names,
        }
        scaling = self._rope_scaling()
        if scaling is not None:
            cfg["rope_scaling"] = scaling
        bos = self.metadata("tokenizer.ggml.bos_token_id")
        if bos is not None:
            cfg["bos_token_id"] = int(bos)
        # Generation ends at any end-of-generation token llama.cpp knows: EOS, end of turn (EOT),
        # end of message (EOM).
        ends = sorted(
            {int(v) for k in ("eos", "eot", "eom")
             if (v := self.metadata(f"tokenizer.ggml.{k}_token_id")) is not None}
        )  # fmt: skip
        if ends:
            cfg["eos_token_id"] = ends[0] if len(ends) == 1 else ends
        return cfg

    def _rope_scaling(self) -> dict[str, Any] | None:
        kind = self._arch("rope.scaling.type", "none")
        if kind in ("none", None):
            return None
        if kind == "linear":
            return {"rope_type": "linear", "factor": float(self._require("rope.scaling.factor"))}
        raise ConfigError(
            f"{self.path}: GGUF rope scaling {kind!r} is not supported; supported: none, linear"
        )

    def _tensor(self, name: str) -> Any:
        for t in self._file.tensors:
            if t.name == name:
                return t
        raise ConfigError(f"{self.path} has no tensor {name}")

    def check_tensors(self) -> None:
        """Every tensor has a supported type and a Hugging Face counterpart (before any work)."""
        for t in self._file.tensors:
            kind = self._types[t.name].name
            if kind not in SUPPORTED_TYPES:
                raise ConfigError(
                    f"{self.path}: tensor {t.name} has GGUF type {kind}, which ds cannot load; "
                    f"supported: {', '.join(SUPPORTED_TYPES)}"
                )
            if hf_name(t.name) is None:
                raise ConfigError(
                    f"{self.path}: tensor {t.name} has no counterpart in the "
                    f"{self.architecture} model family; this GGUF variant is not supported"
                )

    def weights(self, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
        """Every tensor dequantized (through float32) to ``dtype``, under its Hugging Face name
        and layout; one tensor at a time, so a model in bfloat16 never holds float32 copies."""
        gguf = _gguf()
        self.check_tensors()
        cfg = self.config()
        heads = {"attn_q": cfg["num_attention_heads"], "attn_k": cfg["num_key_value_heads"]}
        out: dict[str, torch.Tensor] = {}
        for t in self._file.tensors:
            shape = tuple(reversed(t.shape))
            qtype = self._types[t.name]
            data = gguf.quants.dequantize(self._file.data(t, qtype), qtype)
            w = np.asarray(data, dtype=np.float32).reshape(shape)
            m = _LAYER_RE.fullmatch(t.name)
            if self.architecture in _PERMUTED and m is not None and m.group(2) in heads:
                w = unpermute(w, heads[m.group(2)])
            out[str(hf_name(t.name))] = torch.from_numpy(np.array(w, copy=True)).to(dtype)
        return out


def _uniform(value: Any, key: str, path: Path) -> int:
    if isinstance(value, list):
        if len(set(value)) != 1:
            raise ConfigError(f"{path}: per-layer {key} {value} is not supported (must be uniform)")
        value = value[0]
    return int(value)


@lru_cache(maxsize=2)
def _open_cached(path: Path, mtime_ns: int, size: int) -> GGUFCheckpoint:
    return GGUFCheckpoint(path)


def open_gguf(path: str | Path) -> GGUFCheckpoint:
    """The GGUF file at ``path``, parsed once per process while the file is unchanged (the
    engine and the tokenizer both read it)."""
    p = Path(path).resolve()
    if not p.is_file():
        raise ConfigError(f"{path} does not exist; pass a .gguf file or a model directory")
    st = p.stat()
    return _open_cached(p, st.st_mtime_ns, st.st_size)


def read_gguf(
    path: str | Path, dtype: torch.dtype = torch.float32
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """``(config, weights)`` of a GGUF file, ready for a model family."""
    ckpt = open_gguf(path)
    config = ckpt.config()
    return config, ckpt.weights(dtype)
