"""``deepspeed.checkpointing``: one module with ``deepspeed.runtime.activation_checkpointing.
checkpointing``; DeepSpeed's settings globals read and write ds.zero's settings; contiguous
checkpointing keeps DeepSpeed's preconditions."""

from __future__ import annotations

import pytest

import ds.zero.activation_checkpointing as ac


def test_globals_are_ds_settings_and_preconditions_hold() -> None:
    import ds.full.compat.deepspeed as deepspeed
    from ds.full.compat.deepspeed.runtime.activation_checkpointing import checkpointing

    assert deepspeed.checkpointing is checkpointing
    try:
        checkpointing.configure(None, partition_activations=True, num_checkpoints=4)
        assert checkpointing.PARTITION_ACTIVATIONS and checkpointing.num_layers == 4
        checkpointing.CPU_CHECKPOINT = True
        assert ac.current().cpu_checkpointing and checkpointing.deepspeed_checkpointing_enabled
        with pytest.raises(AssertionError, match="number of layers"):
            checkpointing.configure(None, partition_activations=True, contiguous_checkpointing=True)
        with pytest.raises(AssertionError, match="partitioned activations"):
            checkpointing.configure(None, contiguous_checkpointing=True, num_checkpoints=2)
    finally:
        ac.configure()
