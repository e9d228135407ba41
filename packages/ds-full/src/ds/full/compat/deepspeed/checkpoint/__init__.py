"""``deepspeed.checkpoint``: checkpoint helpers and the key names of DeepSpeed's files."""

from ds.full.compat.deepspeed.checkpoint import constants, utils
from ds.full.compat.deepspeed.checkpoint.constants import *  # noqa: F403
from ds.full.compat.deepspeed.checkpoint.deepspeed_checkpoint import DeepSpeedCheckpoint
from ds.full.compat.deepspeed.checkpoint.reshape_3d_utils import (
    get_model_3d_descriptor,
    model_3d_desc,
)
from ds.full.compat.deepspeed.checkpoint.reshape_meg_2d import reshape_meg_2d_parallel
from ds.full.compat.deepspeed.checkpoint.reshape_utils import merge_state
from ds.full.compat.deepspeed.checkpoint.universal_checkpoint import (
    SubparamShape,
    enable_universal_checkpoint,
)
from ds.full.compat.deepspeed.checkpoint.utils import (
    get_layer_ckpt_name_for_rank,
    get_model_ckpt_name_for_rank,
    get_zero_ckpt_name_for_rank,
)
from ds.full.compat.deepspeed.checkpoint.zero_checkpoint import ZeROCheckpoint

__all__ = [
    "DeepSpeedCheckpoint",
    "SubparamShape",
    "ZeROCheckpoint",
    "constants",
    "enable_universal_checkpoint",
    "get_layer_ckpt_name_for_rank",
    "get_model_3d_descriptor",
    "get_model_ckpt_name_for_rank",
    "get_zero_ckpt_name_for_rank",
    "merge_state",
    "model_3d_desc",
    "reshape_meg_2d_parallel",
    "utils",
]
