"""``deepspeed.runtime.pipe.topology``: ranks laid out on a named cartesian grid.

``ProcessTopology(axes, dims)`` numbers the grid's cells in row-major order (the last axis
varies fastest); ``PipeDataParallelTopology`` is ``pipe x data`` and
``PipeModelDataParallelTopology`` ``pipe x data x model`` (Megatron-DeepSpeed's layout: tensor
slices of one layer on neighbouring ranks). ``PipelineParallelGrid`` builds the process groups of
such a topology on the current process group."""

from __future__ import annotations

import itertools
from collections import namedtuple
from collections.abc import Callable, Iterable
from typing import Any


class ProcessTopology:
    def __init__(self, axes: list[str], dims: list[int]) -> None:
        if len(axes) != len(dims) or len(set(axes)) != len(axes):
            raise ValueError(
                f"ProcessTopology: axes {axes} need distinct names, one per dim {dims}"
            )
        if any(int(d) < 1 for d in dims):
            raise ValueError(f"ProcessTopology: every dim must be >= 1, got {dims}")
        self.axes = list(axes)
        self.dims = [int(d) for d in dims]
        self.ProcessCoord = namedtuple("ProcessCoord", self.axes)  # type: ignore[misc]
        cells = itertools.product(*(range(d) for d in self.dims))
        self.mapping = {self.ProcessCoord(*c): rank for rank, c in enumerate(cells)}
        self._coords = list(self.mapping)

    def get_rank(self, **coord_kwargs: int) -> int:
        if set(coord_kwargs) != set(self.axes):
            raise ValueError(
                f"get_rank needs exactly the axes {self.axes}, got {sorted(coord_kwargs)}"
            )
        return self.mapping[self.ProcessCoord(**coord_kwargs)]

    def get_axis_names(self) -> list[str]:
        return list(self.axes)

    def get_rank_repr(
        self, rank: int, omit_axes: Iterable[str] = ("data", "pipe"), inner_sep: str = "_",
        outer_sep: str = "-",
    ) -> str:  # fmt: skip
        """``axis{inner_sep}NN`` for each axis not omitted, joined by ``outer_sep`` (used in
        checkpoint file names)."""
        coord = self.get_coord(rank)
        omit = set(omit_axes)
        return outer_sep.join(
            f"{a}{inner_sep}{getattr(coord, a):02d}" for a in self.axes if a not in omit
        )

    def get_dim(self, axis: str) -> int:
        return self.dims[self.axes.index(axis)] if axis in self.axes else 0

    def get_coord(self, rank: int) -> Any:
        if not 0 <= rank < len(self._coords):
            raise ValueError(f"rank {rank} not found in topology (world size {self.world_size()})")
        return self._coords[rank]

    def get_axis_comm_lists(self, axis: str) -> list[list[int]]:
        """For each setting of the other axes, the ranks along ``axis`` (a group per list)."""
        if axis not in self.axes:
            return []
        others = [a for a in self.axes if a != axis]
        lists = []
        for fixed in itertools.product(*(range(self.get_dim(a)) for a in others)):
            where = dict(zip(others, fixed))
            lists.append([self.get_rank(**where, **{axis: i}) for i in range(self.get_dim(axis))])
        return lists

    def filter_match(self, **filter_kwargs: int) -> list[int]:
        return [
            rank for coord, rank in self.mapping.items()
            if all(getattr(coord, k) == v for k, v in filter_kwargs.items())
        ]  # fmt: skip

    def get_axis_list(self, axis: str, idx: int) -> list[int]:
        return self.filter_match(**{axis: idx})

    def world_size(self) -> int:
        return len(self.mapping)

    def __str__(self) -> str:
        return str(self.mapping)


def _prime_factors(n: int) -> list[int]:
    if n <= 0:
        raise ValueError(f"_prime_factors({n}): values must be strictly positive")
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out


class PipeDataParallelTopology(ProcessTopology):
    def __init__(self, num_pp: int, num_dp: int) -> None:
        super().__init__(axes=["pipe", "data"], dims=[num_pp, num_dp])


class PipeModelDataParallelTopology(ProcessTopology):
    def __init__(self, num_pp: int, num_mp: int, num_dp: int) -> None:
        super().__init__(axes=["pipe", "data", "model"], dims=[num_pp, num_dp, num_mp])


def _returns(attr: str) -> Callable[[Any], Any]:
    """One of DeepSpeed's ``get_*()`` methods: it returns the attribute ``attr``."""

    def get(self: Any) -> Any:
        return getattr(self, attr)

    return get


class PipelineParallelGrid:
    """The pipe, data and model (tensor-slice) groups of ``topology`` (default: the world's
    prime factors alternately to pipe and data) on the current world; collective."""

    def __init__(self, topology: ProcessTopology | None = None, process_group: Any = None) -> None:
        from ds import comm as dist

        self.global_rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        if topology is None:
            factors = _prime_factors(self.world_size)
            pp = dp = 1
            for i, f in enumerate(factors):
                pp, dp = (pp * f, dp) if i % 2 == 0 else (pp, dp * f)
            topology = PipeDataParallelTopology(num_pp=pp, num_dp=dp)
        if topology.world_size() != self.world_size:
            raise ValueError(
                f"topology {topology.axes}={topology.dims} has {topology.world_size()} ranks, the "
                f"world {self.world_size}; make the dims multiply to the world size"
            )
        self._topo = topology
        self.data_parallel_size = max(topology.get_dim("data"), 1)
        self.pipe_parallel_size = max(topology.get_dim("pipe"), 1)
        self.model_parallel_size = max(topology.get_dim("model"), 1)
        self.slice_parallel_size = self.model_parallel_size
        coord = topology.get_coord(self.global_rank)
        self.stage_id = getattr(coord, "pipe", 0)
        self.data_parallel_id = getattr(coord, "data", 0)
        self.is_first_stage = self.stage_id == 0
        self.is_last_stage = self.stage_id == self.pipe_parallel_size - 1

        def groups(lists: list[list[int]]) -> tuple[list[int], Any]:
            mine: tuple[list[int], Any] = ([self.global_rank], None)
            for ranks in lists:  # every rank creates every group, in the same order
                group = dist.new_group(ranks=ranks)
                if self.global_rank in ranks:
                    mine = (ranks, group)
            return mine

        # DeepSpeed's "model parallel" group: every rank of one data-parallel replica.
        model = [sorted(topology.get_axis_list("data", d)) for d in range(self.data_parallel_size)]
        ranks, self.ds_model_proc_group = groups(model)
        self.ds_model_world_size, self.ds_model_rank = len(ranks), ranks.index(self.global_rank)
        self.dp_groups = topology.get_axis_comm_lists("data") or [
            [r] for r in range(self.world_size)
        ]
        self.dp_group, self.dp_proc_group = groups(self.dp_groups)
        self.pipe_groups = topology.get_axis_comm_lists("pipe") or [
            [r] for r in range(self.world_size)
        ]
        self.pp_group, self.pp_proc_group = groups(self.pipe_groups)
        self.p2p_groups = [
            [r, lst[(lst.index(r) + 1) % len(lst)]]
            for r in range(self.world_size) for lst in self.pipe_groups if r in lst
        ]  # fmt: skip
        slices = topology.get_axis_comm_lists("model") or [[r] for r in range(self.world_size)]
        self.slice_group, self.slice_proc_group = groups(slices)

    def get_stage_id(self) -> int:
        return int(self.stage_id)

    def get_data_parallel_id(self) -> int:
        return int(self.data_parallel_id)

    def stage_to_global(self, stage_id: int, **kwargs: int) -> int:
        me = self._topo.get_coord(self.global_rank)
        return self._topo.get_rank(**me._replace(pipe=stage_id, **kwargs)._asdict())

    def topology(self) -> ProcessTopology:
        return self._topo

    def get_global_rank(self) -> int:
        return self.global_rank

    def get_slice_parallel_rank(self) -> int:
        coord = self._topo.get_coord(self.global_rank)
        return int(getattr(coord, "model", 0))

    def get_data_parallel_group_ranks(self) -> list[int]:
        return list(self.dp_group)

    get_pipe_parallel_rank = get_pipeline_model_parallel_rank = get_stage_id
    get_pipe_parallel_world_size = _returns("pipe_parallel_size")
    get_pipeline_model_parallel_world_size = get_pipe_parallel_world_size
    get_pipe_parallel_group = _returns("pp_proc_group")
    get_data_parallel_rank = get_data_parallel_id
    get_data_parallel_world_size = _returns("data_parallel_size")
    get_data_parallel_group = _returns("dp_proc_group")
    get_model_parallel_rank = _returns("ds_model_rank")
    get_model_parallel_world_size = _returns("ds_model_world_size")
    get_model_parallel_group = _returns("ds_model_proc_group")
    get_tensor_model_parallel_rank = get_slice_parallel_rank
    get_slice_parallel_world_size = _returns("slice_parallel_size")
    get_tensor_model_parallel_world_size = get_slice_parallel_world_size
    get_slice_parallel_group = _returns("slice_proc_group")


__all__ = [
    "PipeDataParallelTopology",
    "PipeModelDataParallelTopology",
    "PipelineParallelGrid",
    "ProcessTopology",
]
