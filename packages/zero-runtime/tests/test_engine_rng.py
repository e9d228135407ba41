"""Checkpoints carry the rank's device RNG state (read and restored through the accelerator's RNG
API) beside the host generators, so dropout on the device continues where it left off."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from ds.interfaces.registry import get
from ds.zero.engine import ZeroEngine


def _accelerator(device_generator: torch.Generator) -> object:
    """The registered cpu accelerator with its RNG API on a generator of its own, standing in
    for a GPU's (torch.cuda's generator is separate from the host's the same way)."""
    acc = get("ds.accelerators", "cpu")()

    class OwnGenerator(type(acc)):  # type: ignore[misc]
        def name(self) -> str:
            return "cpu"

        def get_rng_state(self, index: int | None = None) -> torch.Tensor:
            return device_generator.get_state()

        def set_rng_state(self, state: torch.Tensor, index: int | None = None) -> None:
            device_generator.set_state(state)

    return OwnGenerator()


@pytest.mark.parametrize("stage", [0, 3])
def test_device_rng_state_round_trips(stage: int, tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(7)
    acc = _accelerator(gen)
    cfg = {
        "train_batch_size": 2,
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": stage},
    }
    engine = ZeroEngine(
        nn.Linear(4, 4),
        cfg,
        accelerator=acc,  # type: ignore[arg-type]
        checkpoint_engine=get("ds.checkpoint_engines", "default")(None),
    )
    engine.backward(engine(torch.randn(2, 4)).sum())
    engine.step()
    torch.rand(3, generator=gen)  # the device generator has moved since it was seeded
    engine.save_checkpoint(str(tmp_path), "t")
    want_device = torch.rand(5, generator=gen)
    want_host = torch.rand(5)
    torch.rand(100, generator=gen)
    torch.manual_seed(1234)
    engine.load_checkpoint(str(tmp_path), "t")
    assert torch.equal(torch.rand(5, generator=gen), want_device)
    assert torch.equal(torch.rand(5), want_host)
