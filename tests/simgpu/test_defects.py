"""The GPU-path defects of stages 0-2, each caught by the simulation (world 8 unless noted).

Reverting a fix makes its test fail: the global norm summed into a host float64 and all-reduced
(the strict communicator refuses the host tensor; device values added into a host scalar fail in
the fake mode), reduced ZeRO-2 buckets added into the host partition gradient (device mismatch),
gloo's point-to-point parameter gather on NCCL (the replay reports the send-first deadlock).
"""

from __future__ import annotations

import pytest
from _world import config, device_syncs, train

from ds.interfaces.comm import GLOO_CAPABILITIES
from ds.interfaces.errors import CommError

pytestmark = pytest.mark.simgpu


def _one_step(cfg: dict, **kw):  # type: ignore[no-untyped-def, type-arg]
    cfg["gradient_accumulation_steps"] = 1
    return train(cfg, steps=1, **kw)


def test_global_norm_is_reduced_on_the_device_with_one_host_sync() -> None:
    result = _one_step(config(1, "fp32"))
    for rank in range(8):
        syncs = device_syncs(result, rank)
        assert len(syncs) == 1 and "prepare_step" in syncs[0].where
    assert result.ranks[0].traffic["all_reduce"] == 8  # one float64 squared norm


def test_stage2_cpu_offload_copies_reduced_buckets_to_the_host() -> None:
    result = _one_step(config(2, "bf16", "cpu"), world=4)
    for r in result.ranks:
        assert r.copies["d2h_bytes"] > 0  # the reduced pieces, copied explicitly
        assert r.host_final > 0  # master, its gradient and the moments live on the host


def test_nccl_gathers_parameters_with_all_gather_into_tensor() -> None:
    result = _one_step(config(1, "bf16"))
    kinds = {op.kind for op in result.world.trace(3)}
    assert "all_gather_into_tensor" in kinds
    assert not kinds & {"send", "recv", "all_gather"}


def test_nccl_reduces_to_owners_from_world_two() -> None:
    result = _one_step(config(2, "fp32"), world=2)
    kinds = [op.kind for op in result.world.trace(0)]
    assert "reduce" in kinds  # gloo would all-reduce every bucket at world 2
    assert kinds.count("all_reduce") == 1  # only the norm


def test_gloo_point_to_point_gather_deadlocks_under_nccl_rules() -> None:
    # The same code with gloo's capabilities takes the point-to-point gather: every rank sends
    # first, unbatched, which the replay reports as NCCL's classic deadlock.
    with pytest.raises(CommError, match="deadlock"):
        _one_step(config(1, "fp32"), world=4, capabilities=GLOO_CAPABILITIES)
