"""The stage-3 partitioner's budget: the ``stage3_*`` limits it works within and the bytes of
parameter data it keeps account of."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Stage3Limits:
    """The stage3_* knobs, in parameter elements (as DeepSpeed counts them)."""

    prefetch_bucket_size: int = 50_000_000
    max_live_parameters: int = 1_000_000_000
    max_reuse_distance: int = 1_000_000_000
    param_persistence_threshold: int = 100_000
    reduce_bucket_size: int = 500_000_000
    # Linear layers save the parameter, not its gathered data, for backward (stage3/linear.py).
    memory_efficient_linear: bool = True


@dataclass
class Accounting:
    """Bytes of parameter data this rank holds, kept by the partitioner itself."""

    partition_bytes: int = 0  # every shard resident in memory (excludes NVMe-swapped shards)
    live_bytes: int = 0  # full parameters currently gathered (or being gathered)
    peak_live_bytes: int = 0
    peak_resident_bytes: int = 0
    total_bytes: int = 0  # the whole model, unsharded
    fetched_numel: int = 0  # parameter elements gathered since construction

    @property
    def resident_bytes(self) -> int:
        return self.partition_bytes + self.live_bytes

    def bump(self) -> None:
        self.peak_live_bytes = max(self.peak_live_bytes, self.live_bytes)
        self.peak_resident_bytes = max(self.peak_resident_bytes, self.resident_bytes)


__all__ = ["Accounting", "Stage3Limits"]
