"""``deepspeed.runtime.sequence_parallel.ulysses_sp``: ``UlyssesSPAttentionHF``,
``UlyssesSPDataLoaderAdapter`` and the tiled compute of long sequences (``TiledMLP``,
``sequence_tiled_compute``, ``TiledFusedLogitsLoss``) on ds.parallel.sequence.

In ds, ``sequence_parallel_size`` in the config is all ``ds.initialize`` needs: it builds the mesh
and switches the model's attention to Ulysses. ``register_with_transformers`` is therefore not
needed; it refuses with that instruction rather than build groups ``ds.initialize`` would not use.
"""

from __future__ import annotations

from typing import Any

from ds.interfaces.errors import ConfigError
from ds.parallel.sequence import UlyssesDataLoaderAdapter as _Adapter
from ds.parallel.sequence.tiled import (
    SequenceTiledCompute,
    TiledFusedLogitsLoss,
    TiledMLP,
    sequence_tiled_compute,
)


class UlyssesSPAttentionHF:
    @staticmethod
    def register_with_transformers(*args: Any, **kwargs: Any) -> Any:
        size = kwargs.get("sequence_parallel_size", "N")
        raise ConfigError(
            "UlyssesSPAttentionHF.register_with_transformers is not needed with ds: set "
            f'"sequence_parallel_size": {size} in the config and call deepspeed.initialize '
            "without mpu=; it registers Ulysses attention on the model itself"
        )


class UlyssesSPDataLoaderAdapter(_Adapter):
    """DeepSpeed's signature and behaviour: ``(dl, sp_rank, sp_group, sp_world_size, device)``;
    each rank draws its own batches, they are gathered over the SP group and every loader batch
    yields ``sp_world_size`` micro-batches."""

    def __init__(
        self, dl: Any, sp_rank: int, sp_group: Any, sp_world_size: int, device: Any = None
    ) -> None:
        from ds import comm

        super().__init__(
            dl,
            sp_rank,
            sp_world_size,
            device=device,
            comm=comm.get_communicator(),
            sp_group=sp_group,
        )


__all__ = [
    "SequenceTiledCompute",
    "TiledFusedLogitsLoss",
    "TiledMLP",
    "UlyssesSPAttentionHF",
    "UlyssesSPDataLoaderAdapter",
    "sequence_tiled_compute",
]
