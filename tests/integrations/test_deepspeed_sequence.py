"""``deepspeed.sequence`` and ``deepspeed.runtime.sequence_parallel`` names on ds.parallel."""

from __future__ import annotations

import torch


def test_rotary_names_are_ds_parallel() -> None:
    from ds.full.compat.deepspeed.sequence import layer
    from ds.parallel.sequence import apply_rotary_pos_emb

    assert layer.apply_rotary_pos_emb is apply_rotary_pos_emb
    assert layer._torchembed_available is False
    assert torch.equal(layer._rotate_half(torch.tensor([1.0, 2.0, 3.0, 4.0])),
                       torch.tensor([-3.0, -4.0, 1.0, 2.0]))  # fmt: skip
