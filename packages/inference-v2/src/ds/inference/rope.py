"""Rotary position embeddings: default, linear, llama3, yarn, dynamic NTK and longrope scaling.

The frequencies follow ``transformers.modeling_rope_utils`` operation for operation, so fp32 angles
agree bit for bit. Dynamic NTK and longrope depend on the sequence length: transformers picks the
frequencies of one forward from its largest position; here each sequence of a ragged batch gets
the frequencies its own length (cached tokens + this forward's) selects, which is what
transformers does for that sequence run alone. Keys already cached keep the rotation they were
written with, as in transformers' KV cache.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ds.interfaces.errors import ConfigError

ROPE_TYPES = ("default", "linear", "llama3", "yarn", "dynamic", "longrope")
_SCALED = ("llama3", "yarn", "longrope")


def rope_parameters(config: dict[str, Any]) -> dict[str, Any]:
    """The RoPE settings of a Hugging Face config, old (``rope_scaling``) or new layout."""
    params = dict(config.get("rope_parameters") or {})
    scaling = config.get("rope_scaling") or {}
    params.update({k: v for k, v in scaling.items() if k not in params})
    params.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    if "partial_rotary_factor" not in params and config.get("partial_rotary_factor") is not None:
        params["partial_rotary_factor"] = config["partial_rotary_factor"]
    rope_type = params.get("rope_type", params.get("type", "default")) or "default"
    params["rope_type"] = rope_type
    if rope_type in _SCALED:
        # transformers gives a top-level original_max_position_embeddings (Phi-3) priority.
        if config.get("original_max_position_embeddings") is not None:
            params["original_max_position_embeddings"] = config["original_max_position_embeddings"]
        params.setdefault("original_max_position_embeddings", config.get("max_position_embeddings"))
    params["max_position_embeddings"] = config.get("max_position_embeddings")
    return params


def rotary_dim(head_dim: int, params: dict[str, Any]) -> int:
    return int(head_dim * float(params.get("partial_rotary_factor", 1.0)))


def _exponents(dim: int) -> torch.Tensor:
    return torch.arange(0, dim, 2, dtype=torch.int64).float() / dim


def _need(params: dict[str, Any], *keys: str) -> None:
    missing = [k for k in keys if params.get(k) is None]
    if missing:
        raise ConfigError(
            f"rope type {params['rope_type']!r} needs {missing} in rope_scaling/rope_parameters"
        )


def inv_frequencies(head_dim: int, params: dict[str, Any]) -> torch.Tensor:
    """Frequencies of a static rope type (and the short/unscaled set of the dynamic ones)."""
    base = float(params["rope_theta"])
    dim = rotary_dim(head_dim, params)
    inv = 1.0 / (base ** _exponents(dim))
    rope_type = params["rope_type"]
    if rope_type == "default":
        return inv
    if rope_type == "linear":
        _need(params, "factor")
        return inv / float(params["factor"])
    if rope_type == "dynamic":
        _need(params, "factor", "max_position_embeddings")
        return _dynamic(dim, params, None)
    if rope_type == "llama3":
        _need(params, "factor", "low_freq_factor", "high_freq_factor")
        return _llama3(inv, params)
    if rope_type == "yarn":
        _need(params, "original_max_position_embeddings")
        return _yarn(dim, params)[0]
    if rope_type == "longrope":
        _need(params, "short_factor", "long_factor", "original_max_position_embeddings")
        return _longrope(dim, params, long=False)
    raise ConfigError(f"unsupported rope type {rope_type!r}; supported: {', '.join(ROPE_TYPES)}")


def _llama3(inv: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
    factor = float(params["factor"])
    low = float(params["low_freq_factor"])
    high = float(params["high_freq_factor"])
    old_len = float(params["original_max_position_embeddings"])
    low_wavelen = old_len / low
    high_wavelen = old_len / high
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _dynamic(dim: int, params: dict[str, Any], seq_len: int | None) -> torch.Tensor:
    """NTK-aware base for ``seq_len`` tokens (None: the configured length, i.e. no change)."""
    base: float | torch.Tensor = float(params["rope_theta"])
    factor = float(params["factor"])
    max_pos = int(params["max_position_embeddings"])
    if seq_len is None:
        n: int | torch.Tensor = max_pos
    else:
        # transformers computes this from a 0-dim int64 tensor, i.e. in fp32; so do we.
        n = torch.maximum(torch.tensor(seq_len), torch.tensor(max_pos))
    base = base * ((factor * n / max_pos) - (factor - 1)) ** (dim / (dim - 2))
    return 1.0 / (base ** _exponents(dim))


def _yarn(dim: int, params: dict[str, Any]) -> tuple[torch.Tensor, float]:
    base = float(params["rope_theta"])
    orig = int(params["original_max_position_embeddings"])
    factor = params.get("factor")
    if factor is None:
        factor = int(params["max_position_embeddings"]) / orig
    factor = float(factor)

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = params.get("attention_factor")
    if attention is None:
        m, m_all = params.get("mscale"), params.get("mscale_all_dim")
        attention = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    beta_fast = params.get("beta_fast") or 32
    beta_slow = params.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(orig / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as transformers: avoid a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation = 1 - ramp
    inv = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv, float(attention)


def _longrope(dim: int, params: dict[str, Any], long: bool) -> torch.Tensor:
    ext = torch.tensor(params["long_factor" if long else "short_factor"], dtype=torch.float32)
    if ext.numel() != dim // 2:
        raise ConfigError(
            f"longrope {'long' if long else 'short'}_factor has {ext.numel()} entries; the rotary "
            f"dimension {dim} needs {dim // 2}"
        )
    return 1.0 / (ext * float(params["rope_theta"]) ** _exponents(dim))


def _longrope_attention(params: dict[str, Any]) -> float:
    attention = params.get("attention_factor")
    if attention is not None:
        return float(attention)
    orig = int(params["original_max_position_embeddings"])
    factor = params.get("factor")
    if factor is None:
        factor = int(params["max_position_embeddings"]) / orig
    factor = float(factor)
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))


class Rotary:
    """cos/sin tables for the rotated part of each head (the first ``dim`` features)."""

    def __init__(self, head_dim: int, params: dict[str, Any], device: torch.device | str) -> None:
        self.params = params
        self.rope_type = params["rope_type"]
        self.dim = rotary_dim(head_dim, params)
        self.device = device
        self.inv_freq = inv_frequencies(head_dim, params).to(device)
        self.scaling = 1.0
        self.threshold: int | None = None  # lengths above it use other frequencies
        self._long: torch.Tensor | None = None
        self._by_len: dict[int, torch.Tensor] = {}
        if self.rope_type == "yarn":
            self.scaling = _yarn(self.dim, params)[1]
        elif self.rope_type == "longrope":
            self.scaling = _longrope_attention(params)
            self.threshold = int(params["original_max_position_embeddings"])
            self._long = _longrope(self.dim, params, long=True).to(device)
        elif self.rope_type == "dynamic":
            self.threshold = int(params["max_position_embeddings"])

    def _for_length(self, n: int) -> torch.Tensor:
        if self.threshold is None or n <= self.threshold:
            return self.inv_freq
        if self._long is not None:
            return self._long
        inv = self._by_len.get(n)
        if inv is None:
            if len(self._by_len) > 4096:
                self._by_len.clear()
            inv = _dynamic(self.dim, self.params, n).to(self.device)
            self._by_len[n] = inv
        return inv

    def cos_sin(
        self,
        positions: torch.Tensor,
        dtype: torch.dtype,
        seq_lens: list[int] | None = None,
        token_seq: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``positions`` [T]; for length-dependent types also each sequence's length after this
        forward (``seq_lens`` [S]) and each token's sequence (``token_seq`` [T])."""
        inv: torch.Tensor = self.inv_freq[None, :]
        t = self.threshold
        if t is not None and seq_lens and token_seq is not None and max(seq_lens) > t:
            per_seq = torch.stack([self._for_length(n) for n in seq_lens])
            inv = per_seq[token_seq]
        freqs = positions.float()[:, None] * inv
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        if self.scaling != 1.0:
            cos, sin = cos * self.scaling, sin * self.scaling
        return cos.to(dtype), sin.to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x``: [T, heads, head_dim]; ``cos``/``sin``: [T, rot]. Rotates the first ``rot``
    features of each head (all of them unless the rope is partial) and passes the rest."""
    rot = cos.shape[-1]
    if rot == x.shape[-1]:
        half = rot // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos[:, None, :] + rotated * sin[:, None, :]
    return torch.cat((apply_rotary(x[..., :rot], cos, sin), x[..., rot:]), dim=-1)
