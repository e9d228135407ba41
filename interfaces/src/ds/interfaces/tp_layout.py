"""The names of the record a tensor-parallel parameter carries so a universal checkpoint can merge
its slices into the whole tensor and cut it again at another degree.

The tensor-parallel layers (ds-parallel) write the record on each parameter and gather the
model-level ``universal_checkpoint_info`` from it; the checkpoint converter and loader
(ds-checkpoint-ledger) read both. The key strings are DeepSpeed's, so checkpoints written by
either system are read by the other.
"""

from __future__ import annotations

#: Attribute on a parameter holding its layout record: the restore view (logical shape, per-rank
#: partition sizes, sub-parameter sizes and widths, the shape of this rank's slice) with the
#: conversion view nested under :data:`CONVERSION`.
UC_META_ATTR = "ds_autotp_universal_checkpoint_meta"
#: Key of the conversion view inside the record: only what the model-level info publishes.
CONVERSION = "conversion"

VERSION_KEY = "universal_checkpoint_version"
#: 0.4 records per-rank widths of fused sub-parameters (uneven head counts).
VERSION = 0.4

# model-level universal_checkpoint_info keys
REPLICATED = "tp_replicated_parameter_patterns"
ROW_PARALLEL = "parameter_with_row_parallelism_patterns"
VOCABULARY = "vocabulary_parameter_patterns"
WITH_SUB_PARAMS = "parameter_with_sub_params"
SHARD_WIDTHS = "sub_param_shard_widths"
UNSUPPORTED = "autotp_unsupported_parameter_patterns"
ORIGINAL_VOCAB_SIZE = "original_vocab_size"

__all__ = [
    "CONVERSION",
    "ORIGINAL_VOCAB_SIZE",
    "REPLICATED",
    "ROW_PARALLEL",
    "SHARD_WIDTHS",
    "UC_META_ATTR",
    "UNSUPPORTED",
    "VERSION",
    "VERSION_KEY",
    "VOCABULARY",
    "WITH_SUB_PARAMS",
]
