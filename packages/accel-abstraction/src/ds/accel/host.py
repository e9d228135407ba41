"""What an accelerator shares when the host keeps its random state and it computes in every
floating dtype (the CPU, and the simulated GPU of ds-sim, whose device has no generator)."""

from __future__ import annotations

import torch


class HostRandom:
    """The RNG methods of an accelerator whose random state is torch's host generator."""

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def initial_seed(self) -> int:
        return int(torch.initial_seed())

    def get_rng_state(self, index: int | None = None) -> torch.Tensor:
        return torch.get_rng_state()

    def set_rng_state(self, state: torch.Tensor, index: int | None = None) -> None:
        torch.set_rng_state(state)


class AllFloatDtypes:
    """The dtype methods of an accelerator that computes in fp32, bf16, fp16 and fp64."""

    def is_bf16_supported(self) -> bool:
        return True

    def is_fp16_supported(self) -> bool:
        return True

    def supported_dtypes(self) -> list[torch.dtype]:
        return [torch.float32, torch.bfloat16, torch.float16, torch.float64]
