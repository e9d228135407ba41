"""A DeepSpeed checkpoint tag opened by parallel layout: :class:`ZeroFiles` maps each
(pp, tp, dp) rank of a (possibly smaller) layout to the ZeRO optimizer files it reads and merges
their states; :class:`CheckpointLayout` adds the model-state files and the metadata recorded in
them (see :mod:`ds.checkpoint.deepspeed_topology`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

from ds.checkpoint.deepspeed_topology import (
    GLOBAL_KEYS,
    PARAM_SHAPES,
    all_files,
    degrees_from_metadata,
    files_with_prefix,
    load_file,
    merge_state,
    model_state_metadata,
    zero_files,
)
from ds.checkpoint.rank_layout import ParallelDegrees, RankMap2D, reshape_2d

OPTIMIZER_STATE_DICT = "optimizer_state_dict"
BASE_OPTIMIZER_STATE = "base_optimizer_state"
GROUP_PADDINGS = "group_paddings"
PARTITION_COUNT = "partition_count"


def _check_folder(directory: str) -> None:
    if not os.path.isdir(directory):
        raise AssertionError(f"{directory} is not an existing folder")


def load_model_metadata(directory: str) -> list[tuple[str, dict[str, Any]]]:
    """(file, metadata) for each ``mp_rank_*`` model-state file of a tag (each opened once)."""
    files = files_with_prefix(all_files(directory), "mp_rank_")
    return [(f, model_state_metadata(load_file(f))) for f in files]


def read_degrees(directory: str) -> ParallelDegrees:
    """The (pp, tp, dp) degrees a tag was saved at."""
    return degrees_from_metadata(
        all_files(directory), zero_files(directory), load_model_metadata(directory)
    )


class ZeroFiles:
    """The ZeRO optimizer files of a tag, addressed by the rank of a target layout."""

    def __init__(self, directory: str, source_3d: ParallelDegrees | None = None) -> None:
        _check_folder(directory)
        self.dir = directory
        self.file_list = zero_files(directory)
        self.num_files = len(self.file_list)
        if not self.num_files:
            raise AssertionError(f"No ZeRO files found in {directory}")
        self.src_3d = read_degrees(directory) if source_3d is None else source_3d
        self.reshape(
            ParallelDegrees(self.src_3d.pp_degree, self.src_3d.tp_degree, self.src_3d.dp_degree)
        )

    def get_src_world_size(self) -> int:
        return self.src_3d.world_size()

    def get_src_tp_degree(self) -> int:
        return self.src_3d.tp_degree

    def get_src_pp_degree(self) -> int:
        return self.src_3d.pp_degree

    def get_src_dp_degree(self) -> int:
        return self.src_3d.dp_degree

    def reshape(self, target_3d: ParallelDegrees) -> None:
        self.target_3d = target_3d
        self._3d_file_map = self.src_3d.reshape(target_3d)

    def get_file_indices_for_rank(self, pp_index: int, tp_index: int, dp_index: int) -> list[int]:
        if dp_index >= len(self._3d_file_map):
            raise AssertionError(f"DP index {dp_index} >= DP degree {len(self._3d_file_map)}")
        return self._3d_file_map[dp_index].get_data(pp_index, tp_index)

    def get_files_for_rank(self, pp_index: int, tp_index: int, dp_index: int) -> list[str]:
        return [
            self.file_list[i] for i in self.get_file_indices_for_rank(pp_index, tp_index, dp_index)
        ]

    def get_state_for_rank(
        self,
        pp_index: int,
        tp_index: int,
        dp_index: int,
        keys_to_ignore: Sequence[str] = (),
        strip_tensor_paddings: bool = True,
    ) -> Any:
        """The merged optimizer state of every file the rank reads (padding stripped, the
        partition count set to the target data-parallel degree)."""
        merged: Any = None
        for f in self.get_files_for_rank(pp_index, tp_index, dp_index):
            sd = dict(load_file(f))
            for key in keys_to_ignore:
                sd.pop(key, None)
            if strip_tensor_paddings:
                _strip_paddings(sd)
            merged = sd if merged is None else merge_state(merged, sd)
            optim = merged.get(OPTIMIZER_STATE_DICT)
            if isinstance(optim, dict):
                if optim.get(PARTITION_COUNT):
                    optim[PARTITION_COUNT] = [self.target_3d.dp_degree] * len(
                        optim[PARTITION_COUNT]
                    )
                if strip_tensor_paddings and optim.get(GROUP_PADDINGS):
                    optim[GROUP_PADDINGS] = [0] * len(optim[GROUP_PADDINGS])
        return merged


def _strip_paddings(sd: dict[str, Any]) -> None:
    optim = sd.get(OPTIMIZER_STATE_DICT)
    if not isinstance(optim, dict):
        return
    sd[OPTIMIZER_STATE_DICT] = optim = dict(optim)
    base = optim.get(BASE_OPTIMIZER_STATE)
    paddings = optim.get(GROUP_PADDINGS)
    if not isinstance(base, dict) or not paddings or "state" not in base:
        return
    for key, group in base["state"].items():
        pad = paddings[key]
        if not pad:
            continue
        base["state"][key] = {
            name: value[: value.numel() - pad].clone()
            if name != "step" and torch.is_tensor(value)
            else value
            for name, value in group.items()
        }


class CheckpointLayout:
    """One DeepSpeed checkpoint tag: its files, the degrees it was saved at and those it is
    read at (``tp_degree``/``pp_degree``/``dp_degree``, smaller or equal)."""

    def __init__(
        self,
        directory: str,
        tp_degree: int | None = None,
        pp_degree: int | None = None,
        dp_degree: int | None = None,
    ) -> None:
        _check_folder(directory)
        self.dir = directory
        self.file_list = all_files(directory)
        self.mp_rank_files = files_with_prefix(self.file_list, "mp_rank_")
        self.model_state_metadata: list[tuple[str, dict[str, Any]]] = []
        self.global_state: dict[str, Any] = {}
        for i, f in enumerate(self.mp_rank_files):
            state = load_file(f)
            self.model_state_metadata.append((f, model_state_metadata(state)))
            if i == 0:
                self.global_state["iteration"] = state.get("iteration", 0)
                self.global_state.update({k: state.get(k) for k in GLOBAL_KEYS})
            del state
        source = degrees_from_metadata(
            self.file_list, zero_files(directory), self.model_state_metadata
        )
        self.zero_checkpoint = ZeroFiles(directory, source_3d=source)
        self.tp_degree = source.tp_degree if tp_degree is None else tp_degree
        self.pp_degree = source.pp_degree if pp_degree is None else pp_degree
        self.dp_degree = source.dp_degree if dp_degree is None else dp_degree
        self.original_world_size = source.world_size()
        self.world_size = self.tp_degree * self.pp_degree * self.dp_degree
        self.old_2d_map = RankMap2D(source.pp_degree, source.tp_degree)
        self.old_2d_map.simple_init()
        self.new_2d_map = reshape_2d(
            source.pp_degree, source.tp_degree, self.pp_degree, self.tp_degree
        )
        target = ParallelDegrees(self.pp_degree, self.tp_degree, self.dp_degree)
        if (self.pp_degree, self.tp_degree, self.dp_degree) != (
            source.pp_degree,
            source.tp_degree,
            source.dp_degree,
        ):
            self.zero_checkpoint.reshape(target)

    def is_change_tp_degree(self) -> bool:
        return self.tp_degree != self.zero_checkpoint.get_src_tp_degree()

    def is_change_pp_degree(self) -> bool:
        return self.pp_degree != self.zero_checkpoint.get_src_pp_degree()

    def is_change_dp_degree(self) -> bool:
        return self.dp_degree != self.zero_checkpoint.get_src_dp_degree()

    def _global(self, key: str) -> Any:
        if key not in self.global_state:
            self.global_state[key] = load_file(self.mp_rank_files[0]).get(key)
        return self.global_state[key]

    def get_iteration(self) -> Any:
        return self._global("iteration") or 0

    def get_args(self) -> Any:
        return self._global("args")

    def get_checkpoint_info(self, info_key: str = "checkpoint_info") -> Any:
        return self._global(info_key)

    def get_zero_files(self, pp_index: int, tp_index: int, dp_index: int) -> list[str]:
        return self.zero_checkpoint.get_files_for_rank(pp_index, tp_index, dp_index)

    def get_zero_checkpoint_state(
        self, pp_index: int, tp_index: int, dp_index: int, strip_tensor_paddings: bool = True
    ) -> Any:
        return self.zero_checkpoint.get_state_for_rank(
            pp_index, tp_index, dp_index, [PARAM_SHAPES], strip_tensor_paddings
        )


__all__ = ["CheckpointLayout", "ZeroFiles", "load_model_metadata", "read_degrees"]
