"""Rotary position embedding applied to a sequence-first tensor (DeepSpeed's Ulysses layout).

``t`` is ``[seq, ..., dim]`` and the cos/sin tables broadcast against it with ``rot_dim`` as their
last size; only the first ``rot_dim`` features of ``t`` rotate (partial rotary), the rest pass
through unchanged. The rotation pairs feature ``i`` with ``i + rot_dim / 2`` (the "half" layout of
GPT-NeoX and Llama), see https://kexue.fm/archives/8265.
"""

from __future__ import annotations

import torch


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[x1, x2] -> [-x2, x1]`` over the last dimension split in two halves."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(
    t: torch.Tensor, freqs_cos: torch.Tensor, freqs_sin: torch.Tensor
) -> torch.Tensor:
    rot_dim = freqs_cos.shape[-1]
    rot, rest = t[..., :rot_dim], t[..., rot_dim:]
    rot = rot * freqs_cos + rotate_half(rot) * freqs_sin
    return rot if rest.shape[-1] == 0 else torch.cat((rot, rest), dim=-1)
