"""Pure pieces of ds.comm: operator mapping, formatting, logger statistics, config validation."""

from __future__ import annotations

import io

import pytest
import torch.distributed as tdist
from pydantic import ValidationError

from ds.comm._format import fmt_bytes
from ds.comm._reduce_op import to_torch_op
from ds.comm.coalesced import chunk_sizes
from ds.comm.comms_logger import CommsLogger, CommsLoggerConfig, bus_factor
from ds.interfaces.comm import Communicator, ReduceOp
from ds.interfaces.errors import CommError
from ds.interfaces.registry import get


def test_registry_provides_a_communicator():
    cls = get("ds.comm_backends", "torch")
    assert isinstance(cls(), Communicator)


@pytest.mark.parametrize("op", list(ReduceOp))
def test_reduce_op_maps_every_interface_member(op):
    assert to_torch_op(op) == getattr(tdist.ReduceOp, op.name)
    assert to_torch_op(op.value) == getattr(tdist.ReduceOp, op.name)


def test_torch_reduce_op_passes_through_and_junk_is_rejected():
    assert to_torch_op(tdist.ReduceOp.MAX) == tdist.ReduceOp.MAX
    with pytest.raises(CommError, match="unknown reduction operator"):
        to_torch_op("median")


@pytest.mark.parametrize(
    ("n", "text"),
    [(0, "0 B"), (1024, "1 KiB"), (1536, "1.5 KiB"), (4 << 20, "4 MiB"), (256 << 20, "256 MiB")],
)
def test_fmt_bytes(n, text):
    assert fmt_bytes(n) == text


def test_chunk_sizes_pad_up():
    assert chunk_sizes([1, 5, 6, 0], 3) == [1, 2, 2, 0]


def test_bus_factors():
    assert bus_factor("all_reduce", 4) == pytest.approx(1.5)
    assert bus_factor("all_gather_into_tensor", 4) == pytest.approx(0.75)
    assert bus_factor("reduce_scatter_tensor", 2) == pytest.approx(0.5)
    assert bus_factor("broadcast", 8) == 1.0
    assert bus_factor("all_reduce", 1) == 1.0


def test_logger_rows_and_summary():
    lg = CommsLogger({"enabled": True})
    lg.record("all_reduce", 1 << 20, 0.002, 2)
    lg.record("all_reduce", 1 << 20, 0.004, 2)
    lg.record("broadcast", 1024, 0.001, 2)
    rows = lg.rows()
    ar = rows[0]
    assert (ar["op"], ar["bytes"], ar["count"]) == ("all_reduce", 1 << 20, 2)
    assert ar["avg_ms"] == pytest.approx(3.0)
    assert ar["algbw_gbps"] == pytest.approx((1 << 20) / 0.003 / 1e9)
    assert ar["busbw_gbps"] == pytest.approx(ar["algbw_gbps"])  # 2(n-1)/n = 1 at n = 2
    buf = io.StringIO()
    text = lg.log_summary(rank=0, file=buf)
    assert "1 MiB" in text and "broadcast" in text
    assert buf.getvalue().startswith("Comms summary (rank 0)")
    other = io.StringIO()
    lg.log_summary(rank=1, file=other)
    assert other.getvalue() == ""


def test_logger_prof_ops_and_debug_caller():
    lg = CommsLogger({"enabled": True, "prof_all": False, "prof_ops": ["all_gather"]})
    assert lg.wants("all_gather") and not lg.wants("all_reduce")
    dbg = CommsLogger({"enabled": True, "debug": True})

    def my_training_step():
        dbg.record("all_reduce", 8, 0.001, 2)

    my_training_step()
    assert dbg.rows()[0]["op"] == "all_reduce | my_training_step"


def test_logger_config_rejects_unknown_keys():
    with pytest.raises(ValidationError, match="prof_op"):
        CommsLoggerConfig(prof_op=["x"])


def test_watchdog_describes_each_kind_of_missing_peer():
    from ds.comm.watchdog import describe_missing

    positions = {
        3: None,
        1: (4, "broadcast"),
        2: (7, "all_reduce"),
        4: (5, "all_gather_into_tensor"),
        5: (5, "all_reduce"),
        6: (0, ""),
    }
    assert describe_missing(5, "all_reduce", positions) == (
        "1 (last entered #4 broadcast), 2 (already at #7 all_reduce), "
        "3 (position unknown: store unreachable), 4 (in all_gather_into_tensor #5 instead), "
        "6 (last entered none)"
    )
    assert describe_missing(5, "all_reduce", {1: (5, "all_reduce")}).startswith("none found")


@pytest.mark.parametrize("timeout", [0.0, -5.0, float("nan")])
def test_watchdog_refuses_a_timeout_that_cannot_fire(timeout):
    # NaN fails every comparison: with "<= 0" alone it would pass and the watchdog never fire.
    from ds.comm.watchdog import Watchdog

    with pytest.raises(CommError, match="timeout_s must be > 0 seconds"):
        Watchdog(timeout_s=timeout)


def test_world_group_is_torchs_world_handle():
    import torch.distributed

    from ds import comm

    assert comm.get_world_group() is torch.distributed.group.WORLD
