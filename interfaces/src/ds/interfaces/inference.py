"""InferenceEngine and scheduler contracts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Capacity:
    free_blocks: int
    total_blocks: int
    block_size: int
    active_sequences: int
    max_sequences: int


@runtime_checkable
class InferenceEngine(Protocol):
    def put(self, uids: Sequence[int], tokens: Sequence[Sequence[int]]) -> torch.Tensor: ...
    def query(
        self, uid: int, max_request_tokens: int, max_request_blocks: int
    ) -> tuple[int, int]: ...
    def flush(self, uid: int) -> None: ...
    def capacity(self) -> Capacity: ...


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 64
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()


@runtime_checkable
class Scheduler(Protocol):
    def add_request(self, uid: int, prompt: Sequence[int], params: SamplingParams) -> None: ...
    def step(self) -> dict[int, list[int]]: ...  # new tokens produced this step, by uid
    def has_unfinished(self) -> bool: ...
