"""``deepspeed.utils.comms_logging.CommsLogger``: ds.comm's comms logger keeping DeepSpeed's
record layout and summaries too; ``deepspeed.utils.timer.trim_mean``."""

from __future__ import annotations

import pytest

from ds import comm
from ds.full.compat.deepspeed.utils.comms_logging import CommsLogger, convert_size
from ds.full.compat.deepspeed.utils.timer import trim_mean


def test_records_in_both_layouts_and_summarises() -> None:
    lg = CommsLogger()
    assert not lg.wants("all_reduce")  # off until enabled, as DeepSpeed's
    lg.enabled = True
    lg.stop_profiling_comms()
    lg.start_profiling_op(["all_reduce"])
    assert lg.wants("all_reduce") and not lg.wants("broadcast")
    for ms in (3.0, 1.0, 2.0):
        lg.record("all_reduce", 1024, ms / 1e3, 2)
    count, latencies, algbws, busbws = lg.get_raw_data()["all_reduce"][1024]
    assert count == 3 and latencies == pytest.approx([3.0, 1.0, 2.0])
    assert algbws[1] == pytest.approx(1024 * 8 / 1e-3 / 1e9) and busbws == algbws  # 2(n-1)/n = 1
    summary = lg.get_operation_summary("all_reduce")
    assert summary is not None and summary[1024]["avg_latency_ms"] == pytest.approx(2.0)
    assert summary[1024]["msg_size_str"] == "1.0 KB" and lg.get_total_operations() == 3
    assert "all_reduce" in lg.summary()  # ds.comm's own table sees the same ops
    lg.reset_data()
    assert not lg.has_data() and lg.get_operation_summary("all_reduce") is None


def test_installs_as_ds_comm_logger() -> None:
    lg = CommsLogger()
    comm.configure(comms_logger=lg)
    try:
        assert comm.get_comms_logger() is lg
    finally:
        comm.configure(comms_logger=False)


def test_trim_mean_leaves_its_argument() -> None:
    data = [3.0, 1.0, 2.0, 100.0, 0.0]
    assert trim_mean(data, 0.2) == 2.0 and data == [3.0, 1.0, 2.0, 100.0, 0.0]
    assert trim_mean([], 0.1) == 0 and trim_mean([5.0], 0.5) == 5.0
    assert convert_size(0) == "0B" and convert_size(3 * 1024**2) == "3.0 MB"
