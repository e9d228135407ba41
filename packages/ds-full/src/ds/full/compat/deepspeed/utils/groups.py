"""``deepspeed.utils.groups``: ds trains data-parallel only, so every rank is in one data-parallel
group and the model-, expert- and sequence-parallel worlds have size 1."""

from __future__ import annotations

from typing import Any


def _world() -> int:
    from ds import comm

    return comm.get_world_size() if comm.is_initialized() else 1


def _rank() -> int:
    from ds import comm

    return comm.get_rank() if comm.is_initialized() else 0


def _get_data_parallel_world_size() -> int:
    return _world()


def _get_data_parallel_rank() -> int:
    return _rank()


def _get_data_parallel_group() -> Any:
    return None  # the default (world) group


def _get_sequence_parallel_world_size() -> int:
    return 1


def _get_sequence_parallel_rank() -> int:
    return 0


def _get_sequence_parallel_group() -> Any:
    return None


def _get_model_parallel_world_size() -> int:
    return 1


def _get_expert_parallel_world_size(group_name: str = "") -> int:
    return 1
