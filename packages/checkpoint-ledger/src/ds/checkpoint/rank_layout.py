"""Which saved files feed which rank when a (pipeline, tensor, data)-parallel checkpoint is read
at smaller degrees.

A 3D-parallel run saves one model-state file per (pp, tp) position, numbered pipeline-major
(file ``i`` holds stage ``i // tp`` and tensor rank ``i % tp``), and one ZeRO file per
(dp, pp, tp) rank, numbered data-parallel-major. Shrinking a degree merges neighbouring files:
:meth:`ParallelDegrees.reshape` answers, for every target data-parallel rank, a :class:`RankMap2D`
listing the source file indices each target (pp, tp) position reads. Only shrinking is supported,
and every degree must divide the one it replaces.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def partition_data(items: Sequence[T], parts: int) -> list[list[T]]:
    """``items`` cut into ``parts`` equal consecutive runs (the count must divide evenly)."""
    if len(items) % parts:
        raise AssertionError(f"{len(items)} items do not split into {parts} equal parts")
    size = len(items) // parts
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


class RankMap2D:
    """Source indices per (pipeline stage, tensor rank) of a 2D grid."""

    def __init__(self, pp_degree: int, tp_degree: int) -> None:
        self.pp_degree = pp_degree
        self.tp_degree = tp_degree
        self.map: dict[str, list[Any]] = {}

    def simple_init(self) -> None:
        """The identity layout: position (pp, tp) holds file ``pp * tp_degree + tp``."""
        self.map = {
            self._make_key(i // self.tp_degree, i % self.tp_degree): [i]
            for i in range(self.pp_degree * self.tp_degree)
        }

    def add_data(self, pp_index: int, tp_index: int, data: list[Any]) -> None:
        self._validate_indices(pp_index, tp_index)
        if not isinstance(data, list):
            raise AssertionError(f"data must be a list, got {type(data).__name__}")
        self.map.setdefault(self._make_key(pp_index, tp_index), []).extend(data)

    def get_data(self, pp_index: int | None = None, tp_index: int | None = None) -> list[Any]:
        """The indices at one position; ``None`` for an index means every stage (or rank)."""
        self._validate_indices(pp_index, tp_index)
        pps = range(self.pp_degree) if pp_index is None else [pp_index]
        tps = range(self.tp_degree) if tp_index is None else [tp_index]
        return [v for i in pps for j in tps for v in self.map[self._make_key(i, j)]]

    def print_data(self, tag: str) -> None:
        print(tag)
        for key, value in self.map.items():
            print(f"{key} = {value}")

    def _validate_indices(self, pp_index: int | None, tp_index: int | None) -> None:
        if pp_index is not None and pp_index >= self.pp_degree:
            raise AssertionError(f"pp index {pp_index} >= pp degree {self.pp_degree}")
        if tp_index is not None and tp_index >= self.tp_degree:
            raise AssertionError(f"tp index {tp_index} >= tp degree {self.tp_degree}")

    @staticmethod
    def _make_key(i: int, j: int) -> str:
        return f"{i},{j}"


def reshape_2d(old_pp: int, old_tp: int, new_pp: int, new_tp: int) -> RankMap2D:
    """The model-state files each (pp, tp) position of the smaller grid reads: tensor ranks
    are merged within a stage first, then stages within each tensor rank."""
    if new_pp > old_pp or new_tp > old_tp:
        raise AssertionError(f"cannot grow ({old_pp}, {old_tp}) to ({new_pp}, {new_tp})")
    grid = RankMap2D(old_pp, old_tp)
    grid.simple_init()
    if new_tp != old_tp:
        merged = RankMap2D(old_pp, new_tp)
        for pp in range(old_pp):
            for tp, part in enumerate(partition_data(grid.get_data(pp_index=pp), new_tp)):
                merged.add_data(pp, tp, part)
        grid = merged
    if new_pp != old_pp:
        merged = RankMap2D(new_pp, grid.tp_degree)
        for tp in range(grid.tp_degree):
            for pp, part in enumerate(partition_data(grid.get_data(tp_index=tp), new_pp)):
                merged.add_data(pp, tp, part)
        grid = merged
    return grid


class ParallelDegrees:
    """The (pipeline, tensor, data) degrees a checkpoint was saved at, or is to be read at."""

    def __init__(self, pp_degree: int = 1, tp_degree: int = 1, dp_degree: int = 1) -> None:
        self.pp_degree = pp_degree
        self.tp_degree = tp_degree
        self.dp_degree = dp_degree

    def world_size(self) -> int:
        return self.pp_degree * self.tp_degree * self.dp_degree

    def get_desc(self) -> str:
        return f"PP,TP,DP = ({self.pp_degree}, {self.tp_degree}, {self.dp_degree})"

    def _dims(self) -> list[tuple[str, int]]:
        return [("PP", self.pp_degree), ("TP", self.tp_degree), ("DP", self.dp_degree)]

    def is_valid(self, pp_index: int, tp_index: int, dp_index: int) -> tuple[bool, list[str]]:
        errors = [
            f"{dim} indexing error: index {index} >= degree {degree}"
            for index, (dim, degree) in zip((pp_index, tp_index, dp_index), self._dims())
            if index >= degree
        ]
        return not errors, errors

    def can_reshape(self, target: ParallelDegrees) -> tuple[bool, list[str]]:
        errors = [
            f"Expansion reshape not supported - {dim}: {old} ---> {new}"
            for (dim, old), (_, new) in zip(self._dims(), target._dims())
            if new > old
        ]
        return not errors, errors

    def reshape(self, target: ParallelDegrees, verbose: bool = False) -> list[RankMap2D]:
        """One map per target data-parallel rank: the ZeRO file indices each of its (pp, tp)
        positions reads. ZeRO file ``idx + k * pp * tp`` is data-parallel replica ``k`` of
        model-state position ``idx``."""
        ok, errors = self.can_reshape(target)
        if not ok:
            raise AssertionError(",".join(errors))
        grid = reshape_2d(self.pp_degree, self.tp_degree, target.pp_degree, target.tp_degree)
        stride = self.pp_degree * self.tp_degree
        out = [RankMap2D(grid.pp_degree, grid.tp_degree) for _ in range(target.dp_degree)]
        for pp in range(grid.pp_degree):
            for tp in range(grid.tp_degree):
                files = [
                    i + k * stride for i in grid.get_data(pp, tp) for k in range(self.dp_degree)
                ]
                for rank_map, part in zip(out, partition_data(files, target.dp_degree)):
                    rank_map.add_data(pp, tp, part)
        if verbose:
            for dp, rank_map in enumerate(out):
                rank_map.print_data(f"dp = {dp}")
        return out


__all__ = ["ParallelDegrees", "RankMap2D", "partition_data", "reshape_2d"]
