"""``deepspeed.checkpoint.reshape_3d_utils``: a checkpoint's (pp, tp, dp) degrees and the files
each rank of a smaller layout reads (:mod:`ds.checkpoint.rank_layout`)."""

from __future__ import annotations

from ds.checkpoint.deepspeed_3d import read_degrees as get_model_3d_descriptor
from ds.checkpoint.deepspeed_topology import (
    degrees_from_metadata as get_model_3d_descriptor_from_metadata,
)
from ds.checkpoint.rank_layout import ParallelDegrees as model_3d_desc

PP_DIM = "PP"
TP_DIM = "TP"
DP_DIM = "DP"

__all__ = ["get_model_3d_descriptor", "get_model_3d_descriptor_from_metadata", "model_3d_desc"]
