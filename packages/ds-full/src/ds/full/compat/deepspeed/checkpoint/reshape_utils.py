"""``deepspeed.checkpoint.reshape_utils``: listing a tag's files and merging partition states
(:mod:`ds.checkpoint.deepspeed_topology`)."""

from __future__ import annotations

from ds.checkpoint.deepspeed_topology import all_files as get_files
from ds.checkpoint.deepspeed_topology import files_with_prefix as get_files_with_prefix
from ds.checkpoint.deepspeed_topology import merge_state
from ds.checkpoint.deepspeed_topology import zero_files as get_zero_files
from ds.checkpoint.rank_layout import partition_data

__all__ = ["get_files", "get_files_with_prefix", "get_zero_files", "merge_state", "partition_data"]
