"""``deepspeed.zero.Init``: ds.zero.Init taking DeepSpeed's arguments, in DeepSpeed's order.

What DeepSpeed's Init decides from its arguments, this decides the same way before handing over
to ds.zero.Init: the config may come as ``config_dict_or_path`` or the older ``config``, as a
dict or a JSON file; the parameters' dtype is the given one, else the config's precision (bf16,
fp16, else fp32), else, with no config at all, the dtype they are built in (DeepSpeed would
make them fp16); the process group is set up from the launcher's environment when nothing set it up
yet. Parameters built inside carry DeepSpeed's attributes (``ds_id``, ``ds_status``,
``ds_tensor``, ``ds_numel``, ``ds_shape``, ``ds_persist``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ds.full.compat.deepspeed._missing import FeatureNotAvailableError
from ds.zero import init as _init


def _config_dict(source: Any) -> dict[str, Any] | None:
    if source is None:
        return None
    if isinstance(source, Mapping):
        return dict(source)
    if isinstance(source, (str, Path)):
        return json.loads(Path(source).read_text())  # type: ignore[no-any-return]
    raise TypeError(f"zero.Init config must be a dict or a JSON file path, got {type(source)}")


def _enabled(cfg: Mapping[str, Any], key: str) -> bool:
    section = cfg.get(key)
    if key == "bf16" and section is None:
        section = cfg.get("bfloat16")
    return isinstance(section, Mapping) and bool(section.get("enabled", False))


def _dtype(cfg: Mapping[str, Any] | None, dtype: torch.dtype | None) -> torch.dtype | None:
    # Without a config (and no dtype) the parameters keep the dtype they are built in; DeepSpeed
    # would make them fp16, which an fp32 engine config then cannot train.
    if dtype is not None or cfg is None:
        return dtype
    if _enabled(cfg, "bf16") and _enabled(cfg, "fp16"):
        raise ValueError("zero.Init: the config enables both bf16 and fp16; keep one")
    if _enabled(cfg, "bf16"):
        return torch.bfloat16
    return torch.float16 if _enabled(cfg, "fp16") else torch.float32


class Init(_init.Init):
    """``with deepspeed.zero.Init(config_dict_or_path=ds_config): model = MyModel()``."""

    def __init__(
        self,
        module: torch.nn.Module | None = None,
        data_parallel_group: Any = None,
        mem_efficient_linear: bool = True,
        remote_device: str | None = None,
        pin_memory: bool = False,
        config_dict_or_path: Any = None,
        config: Any = None,
        enabled: bool = True,
        dtype: torch.dtype | None = None,
        mpu: Any = None,
        zero_param_parallel_group: Any = None,
        zero_quantized_weights: bool = False,
        zero_quantized_nontrainable_weights: bool = False,
        sequence_data_parallel_group: Any = None,
        param_swapper: Any = None,
    ) -> None:
        # mem_efficient_linear: ds's stage 3 always runs nn.Linear through its memory-saving
        # linear function, per module; mpu: only its config reading matters to DeepSpeed here.
        cfg = _config_dict(config if config is not None else config_dict_or_path)
        if zero_quantized_weights or zero_quantized_nontrainable_weights:
            raise FeatureNotAvailableError(
                "deepspeed.zero.Init: quantized ZeRO-3 weights (ZeRO++ qwZ) are not available in "
                "ds; build the model without zero_quantized_weights"
            )
        if zero_param_parallel_group is not None or param_swapper is not None:
            raise FeatureNotAvailableError(
                "deepspeed.zero.Init: hierarchical partitioning (zero_param_parallel_group) and "
                "custom parameter swappers are not available in ds; use offload_param instead"
            )
        if data_parallel_group is not None and sequence_data_parallel_group is not None:
            raise ValueError(
                "zero.Init: give data_parallel_group or the older sequence_data_parallel_group, "
                "not both"
            )
        group = (
            data_parallel_group if data_parallel_group is not None else sequence_data_parallel_group
        )
        if enabled:
            from ds import comm

            if not comm.is_initialized():
                from ds.full.training import init_distributed

                init_distributed()
        super().__init__(
            module,
            group,
            cfg,
            remote_device,
            pin_memory,
            dtype=_dtype(cfg, dtype) if enabled else dtype,
            enabled=enabled,
        )


__all__ = ["Init"]
