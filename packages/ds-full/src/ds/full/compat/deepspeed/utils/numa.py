"""``deepspeed.utils.numa``: core-list parsing for ``--bind_core_list`` (``ds run`` binds cores
itself with ``--bind_cores_to_rank``)."""

from __future__ import annotations

from ds.full.compat.deepspeed._missing import missing_function


def parse_range(rng: str) -> list[int]:
    """``"N"`` -> [N]; ``"N-M"`` (M >= N) -> [N, ..., M]."""
    from ds.launcher.agent import parse_core_list

    lo, sep, hi = rng.strip().partition("-")
    if sep and hi.strip().isdigit() and lo.strip().isdigit() and int(hi) < int(lo):
        raise ValueError(f"bad range {rng!r}: the end must not be below the start")
    cores = parse_core_list(rng)
    if not cores:
        raise ValueError(f"bad range {rng!r}: expected N or N-M")
    return cores


def parse_range_list(range_str: str) -> list[int]:
    """``"0,2-4,6"`` -> [0, 2, 3, 4, 6]; sub-ranges must ascend without overlapping."""
    out: list[int] = []
    for part in range_str.split(","):
        cores = parse_range(part)
        if out and cores[0] <= out[-1]:
            raise ValueError(
                f"bad range list {range_str!r}: sub-ranges must ascend without overlapping"
            )
        out.extend(cores)
    return out


get_numactl_cmd = missing_function(
    "deepspeed.utils.numa.get_numactl_cmd",
    "numactl command lines per rank",
    "'ds run --bind_cores_to_rank [--bind_core_list LIST]' binds each rank's cores",
)

__all__ = ["get_numactl_cmd", "parse_range", "parse_range_list"]
