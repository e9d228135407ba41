"""``deepspeed.utils.comms_logging.CommsLogger``: ds.comm's comms logger with DeepSpeed's API.

Install one with ``ds.comm.configure(comms_logger=CommsLogger())``: every collective ds.comm
times is then kept both in ds's statistics (``summary()``) and in DeepSpeed's record layout,
``comms_dict = {op: {msg_size: [count, [latency_ms], [algbw_gbps], [busbw_gbps]]}}``, which the
DeepSpeed methods below read. Bandwidths follow ds.comm's convention (nccl-tests': algorithmic
bytes over time, bus bandwidth scaled by the op's factor).
"""

from __future__ import annotations

from typing import Any

from ds.comm.comms_logger import CommsLogger as _DsCommsLogger
from ds.comm.comms_logger import bus_factor
from ds.full.compat.deepspeed.utils.timer import trim_mean


def convert_size(size_bytes: int) -> str:
    """``1536`` -> ``"1.5 KB"`` (DeepSpeed's size rendering)."""
    units = ("B", "KB", "MB", "GB", "TB", "PB")
    size, i = float(size_bytes), 0
    while size >= 1024 and i < len(units) - 1:
        size, i = size / 1024, i + 1
    return f"{round(size, 2)} {units[i]}" if i else f"{size_bytes}B"


class CommsLogger(_DsCommsLogger):
    def __init__(self, config: Any = None) -> None:
        super().__init__(config if config is not None else {"enabled": False})
        c = self.config
        # DeepSpeed's switches are plain attributes that its start/stop methods flip.
        self.enabled, self.verbose, self.debug = c.enabled, c.verbose, c.debug
        self.prof_all, self.prof_ops = c.prof_all, list(c.prof_ops)
        self.comms_dict: dict[str, dict[int, list[Any]]] = {}

    def configure(self, comms_config: Any) -> None:
        """Take a DeepSpeedConfig's ``comms_logger`` settings."""
        self.enabled = bool(comms_config.comms_logger_enabled)
        if self.enabled:
            section = comms_config.comms_logger
            self.verbose, self.debug = section.verbose, section.debug
            self.prof_all, self.prof_ops = section.prof_all, list(section.prof_ops)

    def wants(self, op: str) -> bool:
        return self.enabled and (self.prof_all or op in self.prof_ops)

    def start_profiling_comms(self) -> None:
        self.prof_all = True

    def stop_profiling_comms(self) -> None:
        self.prof_all = False

    def start_profiling_op(self, op_name_list: list[str]) -> None:
        self.prof_ops = sorted(set(self.prof_ops) | set(op_name_list))

    def stop_profiling_op(self, op_name_list: list[str]) -> None:
        self.prof_ops = [op for op in self.prof_ops if op not in op_name_list]

    def record(self, op: str, nbytes: int, latency_s: float, group_size: int) -> None:
        super().record(op, nbytes, latency_s, group_size)
        latency_ms = latency_s * 1e3
        algbw = nbytes * 8 / latency_s / 1e9 if latency_s > 0 else 0.0
        self.append(op, op, latency_ms, nbytes, algbw, algbw * bus_factor(op, group_size))

    def append(
        self,
        raw_name: str,
        record_name: str,
        latency: float,
        msg_size: int,
        algbw: float = 0.0,
        busbw: float = 0.0,
    ) -> None:
        """Add one op of ``msg_size`` bytes taking ``latency`` ms to DeepSpeed's records."""
        entry = self.comms_dict.setdefault(record_name, {}).setdefault(msg_size, [0, [], [], []])
        entry[0] += 1
        entry[1].append(latency)
        entry[2].append(algbw)
        entry[3].append(busbw)

    def get_raw_data(self) -> dict[str, dict[int, list[Any]]]:
        return self.comms_dict.copy()

    def has_data(self) -> bool:
        return bool(self.comms_dict)

    def reset_data(self) -> None:
        self.comms_dict.clear()
        self.reset()

    def get_operation_names(self) -> list[str]:
        return list(self.comms_dict)

    def get_total_operations(self) -> int:
        return sum(entry[0] for sizes in self.comms_dict.values() for entry in sizes.values())

    def get_operation_summary(self, operation_name: str) -> dict[int, dict[str, Any]] | None:
        """Per message size: count, total latency and the 10%-trimmed means (None for an op
        never recorded). The records are read, not reordered."""
        sizes = self.comms_dict.get(operation_name)
        if sizes is None:
            return None
        return {
            size: {
                "count": count,
                "total_latency_ms": sum(latencies),
                "avg_latency_ms": trim_mean(latencies, 0.1),
                "tput_avg_gbps": trim_mean(algbws, 0.1),
                "busbw_avg_gbps": trim_mean(busbws, 0.1),
                "msg_size_bytes": size,
                "msg_size_str": convert_size(size),
            }
            for size, (count, latencies, algbws, busbws) in sizes.items()
        }

    def log_all(
        self, print_log: bool = True, show_straggler: bool = False, return_dict: bool = False
    ) -> dict[str, Any] | None:
        """Print ds.comm's summary table (rank 0); with ``return_dict``, every op's summary."""
        if print_log:
            self.log_summary()
        if return_dict:
            return {op: self.get_operation_summary(op) for op in self.comms_dict}
        return None


__all__ = ["CommsLogger", "convert_size"]
