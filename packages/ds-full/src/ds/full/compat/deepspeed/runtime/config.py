"""``deepspeed.runtime.config.DeepSpeedConfig``: a DeepSpeed config read, validated and resolved
by ds (``ds.zero.config``: one schema), with DeepSpeed's attribute names.

``DeepSpeedConfig(config, mpu=None)`` takes a dict, a JSON path or a base64-encoded JSON string;
the batch triad is resolved for the data-parallel world (``mpu``'s, else the process group's,
else ``WORLD_SIZE``, else 1), as DeepSpeed does when the engine is built."""

from __future__ import annotations

import base64
import json
import os
from typing import Any

from ds.full.compat.deepspeed.runtime.constants import (
    GRADIENT_CLIPPING_DEFAULT,
    LOG_LEVEL_DEFAULT,
)
from ds.interfaces.errors import ConfigError
from ds.zero.config import load_config, resolve
from ds.zero.config.sections import OPTIMIZERS_IMPLEMENTED

# The ``optimizer.type`` names of DeepSpeed's config vocabulary. ds builds the ones in
# ``DEEPSPEED_OPTIMIZERS`` from the section itself; a config naming another of them (lamb, the
# mu-P optimizers) is refused by ds's config with a message naming the type.
ADAGRAD_OPTIMIZER = "adagrad"
ADAM_OPTIMIZER = "adam"
ADAMW_OPTIMIZER = "adamw"
LAMB_OPTIMIZER = "lamb"
MUADAM_OPTIMIZER = "muadam"
MUADAMW_OPTIMIZER = "muadamw"
MUSGD_OPTIMIZER = "musgd"
LION_OPTIMIZER = "lion"
MUON_OPTIMIZER = "muon"
DEEPSPEED_OPTIMIZERS = list(OPTIMIZERS_IMPLEMENTED)
TORCH_ADAM_PARAM = "torch_adam"
ADAM_W_MODE = "adam_w_mode"
ADAM_W_MODE_DEFAULT = True
EXPERT_PARALLEL = "expert_parallel"


class DeepSpeedConfigError(ConfigError):
    """The config is invalid (ds's message names the key and the fix)."""


def _read(config: Any) -> Any:
    if isinstance(config, dict):
        return config
    if isinstance(config, str) and not os.path.exists(config):
        try:
            return json.loads(base64.urlsafe_b64decode(config).decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            raise DeepSpeedConfigError(
                f"DeepSpeedConfig({config[:60]!r}): not a dict, an existing JSON file or a "
                "base64-encoded JSON config"
            ) from None
    return config


def _world(mpu: Any) -> tuple[int, int]:
    from ds import comm

    rank = comm.get_rank() if comm.is_initialized() else int(os.environ.get("RANK", "0"))
    if mpu is not None:
        return mpu.get_data_parallel_world_size(), rank
    if comm.is_initialized():
        return comm.get_world_size(), rank
    return int(os.environ.get("WORLD_SIZE", "1")), rank


def get_scalar_param(param_dict: dict[str, Any], param_name: str, param_default_value: Any) -> Any:
    return param_dict.get(param_name, param_default_value)


def get_gradient_clipping(param_dict: dict[str, Any]) -> Any:
    return get_scalar_param(param_dict, "gradient_clipping", GRADIENT_CLIPPING_DEFAULT)


def get_log_level(param_dict: dict[str, Any]) -> Any:
    return get_scalar_param(param_dict, "log_level", LOG_LEVEL_DEFAULT)


class DeepSpeedConfig:
    def __init__(self, config: Any, mpu: Any = None, mesh_device: Any = None) -> None:
        raw = _read(config)
        try:
            self._cfg = load_config(raw)
        except ConfigError as exc:
            raise DeepSpeedConfigError(str(exc)) from None
        self._param_dict = raw if isinstance(raw, dict) else self._cfg.model_dump(by_alias=True)
        from ds.full.compat.deepspeed.monitor.config import get_monitor_config

        self.monitor_config = get_monitor_config(self._param_dict)
        self.world_size, self.global_rank = _world(mpu)
        sp = self._cfg.sequence_parallel_size or 1
        self.world_size = max(1, self.world_size // sp)
        try:
            self._resolved = resolve(self._cfg, self.world_size)
        except ConfigError as exc:
            raise DeepSpeedConfigError(str(exc)) from None
        cfg, res = self._cfg, self._resolved
        self.train_batch_size = res.train_batch_size
        self.train_micro_batch_size_per_gpu = res.train_micro_batch_size_per_gpu
        self.gradient_accumulation_steps = res.gradient_accumulation_steps
        self.gradient_clipping = res.gradient_clipping
        self.gradient_allreduce_op = cfg.gradient_allreduce_op
        self.log_level = res.log_level
        self.param_dtype, self.buffer_dtype = res.param_dtype, res.buffer_dtype
        self.zero_config = cfg.zero_optimization
        self.zero_optimization_stage = int(cfg.zero_optimization.stage)
        self.zero_enabled = self.zero_optimization_stage > 0
        self.float16_config, self.bfloat16_config = cfg.fp16, cfg.bf16
        self.fp16_enabled = cfg.precision == "fp16"
        self.bfloat16_enabled = cfg.precision == "bf16"
        self.fp16_auto_cast = bool(cfg.fp16.auto_cast)
        self.loss_scale = cfg.fp16.loss_scale
        self.optimizer_name = cfg.optimizer.type.lower() if cfg.optimizer else None
        self.optimizer_params = dict(cfg.optimizer.params) if cfg.optimizer else None
        self.scheduler_name = cfg.scheduler.type if cfg.scheduler else None
        self.scheduler_params = dict(cfg.scheduler.params) if cfg.scheduler else None
        self.steps_per_print = cfg.steps_per_print
        self.wall_clock_breakdown = cfg.wall_clock_breakdown
        self.prescale_gradients = cfg.prescale_gradients
        self.gradient_predivide_factor = cfg.gradient_predivide_factor
        self.communication_data_type = cfg.communication_data_type
        self.zero_allow_untested_optimizer = cfg.zero_allow_untested_optimizer
        self.activation_checkpointing_config = cfg.activation_checkpointing
        self.dataloader_drop_last = bool(cfg.dataloader_drop_last)
        self.seed = cfg.seed
        self.pipeline = dict(cfg.pipeline or {})
        self.sequence_parallel_size = sp
        from ds.parallel.moe.autoep_config import parse_autoep_config

        # the AutoEP section, checked as DeepSpeed checks it (an unsupported value is refused
        # here, before any model is built)
        self.expert_parallel_config = parse_autoep_config(self._param_dict.get("expert_parallel"))
        self.elasticity_enabled = False  # DeepSpeed 0.19.8 refuses the section, as ds does

    def print(self, name: str) -> None:
        print(f"{name}:")
        for key in sorted(vars(self)):
            if not key.startswith("_"):
                print(f"  {key} {'.' * max(1, 29 - len(key))} {getattr(self, key)}")


__all__ = [
    "ADAGRAD_OPTIMIZER",
    "ADAMW_OPTIMIZER",
    "ADAM_OPTIMIZER",
    "ADAM_W_MODE",
    "ADAM_W_MODE_DEFAULT",
    "DEEPSPEED_OPTIMIZERS",
    "EXPERT_PARALLEL",
    "LAMB_OPTIMIZER",
    "LION_OPTIMIZER",
    "MUADAMW_OPTIMIZER",
    "MUADAM_OPTIMIZER",
    "MUON_OPTIMIZER",
    "MUSGD_OPTIMIZER",
    "TORCH_ADAM_PARAM",
    "DeepSpeedConfig",
    "DeepSpeedConfigError",
    "get_gradient_clipping",
    "get_log_level",
    "get_scalar_param",
]
