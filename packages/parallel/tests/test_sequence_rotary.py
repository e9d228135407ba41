"""Rotary embedding on ``[seq, heads, dim]``: the rotation of complex pairs, partial rotary."""

from __future__ import annotations

import torch

from ds.parallel.sequence import apply_rotary_pos_emb


def _tables(seq: int, rot: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    inv = 1.0 / (10000.0 ** (torch.arange(0, rot, 2).float() / rot))
    angles = torch.outer(torch.arange(seq).float(), inv)
    emb = torch.cat((angles, angles), dim=-1).unsqueeze(1)
    return emb.cos(), emb.sin(), angles


def test_half_layout_is_complex_rotation_and_rest_passes_through() -> None:
    seq, heads, dim, rot = 5, 3, 16, 8
    t = torch.randn(seq, heads, dim)
    cos, sin, angles = _tables(seq, rot)
    out = apply_rotary_pos_emb(t, cos, sin)
    half = rot // 2
    z = torch.complex(t[..., :half], t[..., half:rot]) * torch.polar(
        torch.ones_like(angles), angles
    ).unsqueeze(1)
    torch.testing.assert_close(out[..., :half], z.real)
    torch.testing.assert_close(out[..., half:rot], z.imag)
    assert torch.equal(out[..., rot:], t[..., rot:])
    # a rotation keeps each pair's norm
    torch.testing.assert_close(out.norm(dim=-1), t.norm(dim=-1))


def test_gradient_is_inverse_rotation() -> None:
    t = torch.randn(4, 2, 8, requires_grad=True)
    cos, sin, _ = _tables(4, 8)
    g = torch.randn(4, 2, 8)
    apply_rotary_pos_emb(t, cos, sin).backward(g)
    assert t.grad is not None
    torch.testing.assert_close(t.grad, apply_rotary_pos_emb(g, cos, -sin))
