"""The ``deepspeed`` names that training scripts use, mapped onto ds.

``import ds.full.compat.deepspeed as deepspeed`` (or ``ds.full.compat.install()`` and then
``import deepspeed``). See docs/integrations.md for the full table.
"""

from __future__ import annotations

import argparse
from typing import Any

from ds.full.compat.deepspeed import (
    accelerator,
    checkpoint,
    checkpointing,
    comm,
    elasticity,
    git_version_info,
    launcher,
    moe,
    ops,
    pipe,
    profiling,
    runtime,
    sequence,
    utils,
    zero,
)
from ds.full.compat.deepspeed._missing import missing_function
from ds.full.compat.deepspeed.accelerator import get_accelerator
from ds.full.compat.deepspeed.git_version_info import git_branch, git_hash, version
from ds.full.compat.deepspeed.utils.init_on_device import OnDevice
from ds.full.training import init_distributed
from ds.full.training import initialize as _ds_initialize
from ds.interfaces.errors import ConfigError

# The DeepSpeed release whose API ds serves (libraries gate features on it); ds's own version is
# git_version_info.ds_version.
__version__ = version
__version_major__, __version_minor__, __version_patch__ = (int(v) for v in version.split("."))
__git_hash__, __git_branch__ = git_hash, git_branch


def _engine_class() -> Any:
    from ds.zero.engine import ZeroEngine

    return ZeroEngine


def __getattr__(name: str) -> Any:
    # The engine class is imported on first use so that importing the shim stays light.
    if name in ("DeepSpeedConfig", "DeepSpeedConfigError"):
        from ds.full.compat.deepspeed.runtime import config

        return getattr(config, name)
    if name == "DeepSpeedDataLoader":
        from ds.full.compat.deepspeed.runtime.dataloader import DeepSpeedDataLoader

        return DeepSpeedDataLoader
    if name == "PipelineModule":
        return pipe.PipelineModule
    if name == "PipelineEngine":  # what initialize returns for a PipelineModule
        from ds.full.pipeline import PipelineEngine

        return PipelineEngine
    if name in ("DeepSpeedEngine", "DeepSpeedHybridEngine"):
        if name != "DeepSpeedEngine":
            raise AttributeError(
                f"deepspeed.{name} has no ds equivalent (the hybrid engine is not in ds yet)"
            )
        return _engine_class()
    raise AttributeError(f"module 'deepspeed' (ds compatibility shim) has no attribute {name!r}")


class InitializeArgumentError(ConfigError, AssertionError):
    """initialize() was called without what it needs (DeepSpeed asserts, hence AssertionError)."""


def initialize(args: Any = None, model: Any = None, *rest: Any, **kwargs: Any) -> Any:
    """``deepspeed.initialize``: ``ds.full.initialize`` with DeepSpeed's argument rules (a config
    given both as ``args.deepspeed_config`` and as ``config=`` is refused, as DeepSpeed does)."""
    config = (
        kwargs.get("config") if kwargs.get("config") is not None else kwargs.get("config_params")
    )
    if len(rest) >= 9:  # config given positionally (after collate_fn)
        config = rest[8] if config is None else config
    if args is not None:
        old = getattr(args, "deepscale_config", None)
        if old is not None:
            if getattr(args, "deepspeed_config", None) is not None:
                raise ConfigError(
                    "both --deepscale_config and --deepspeed_config are given; keep only "
                    "--deepspeed_config"
                )
            args.deepspeed_config, args.deepscale_config = old, None
        from_args = getattr(args, "deepspeed_config", None)
        if from_args is not None and config is not None:
            raise ConfigError(
                f"a config is given twice: --deepspeed_config {from_args} and the config= "
                "argument of initialize(); DeepSpeed refuses this too. Drop --deepspeed_config "
                "from the command line or config= from the call"
            )
    if model is None:
        passed_as_args = hasattr(args, "parameters")  # initialize(model) binds it to args
        hint = (
            " (the module came as args=, the first positional argument)" if passed_as_args else ""
        )
        raise InitializeArgumentError(
            f"deepspeed.initialize needs model=, the torch.nn.Module to train{hint}"
        )
    result = _ds_initialize(args, model, *rest, **kwargs)
    from ds.full.compat.deepspeed.utils.logging import set_log_level_from_string
    from ds.full.compat.deepspeed.utils.tensor_fragment import register_engine

    register_engine(result[0])  # safe_get/set_* find parameters' masters through it
    level = getattr(result[0], "log_level", None)
    if callable(level) and level() is not None:
        set_log_level_from_string(level())  # the config's log_level is DeepSpeed's logger's
    return result


init_inference = missing_function(
    "deepspeed.init_inference",
    "DeepSpeed-Inference (kernel injection, tensor-parallel inference)",
    "serve models with 'ds serve' or ds.inference (ragged batching, blocked KV cache)",
)


def add_config_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``--deepspeed``/``--deepspeed_config`` (and the old ``--deepscale`` spellings)."""
    group = parser.add_argument_group("DeepSpeed", "DeepSpeed configurations")
    group.add_argument("--deepspeed", default=False, action="store_true", help="enable ds")
    group.add_argument("--deepspeed_config", default=None, type=str, help="ds JSON config path")
    group.add_argument("--deepscale", default=False, action="store_true", help=argparse.SUPPRESS)
    group.add_argument("--deepscale_config", default=None, type=str, help=argparse.SUPPRESS)
    return parser


def tp_model_init(
    model: Any, tp_size: int, dtype: Any = None, config: Any = None, **kw: Any
) -> Any:
    """``deepspeed.tp_model_init``: split ``model`` over ``tp_size`` ranks now (AutoTP); pass the
    same size as ``tensor_parallel.autotp_size`` to ``deepspeed.initialize``."""
    from ds import comm as dist
    from ds.full.parallel import tp_model_init as _tp_model_init

    if dtype is not None:
        model = model.to(dtype)
    return _tp_model_init(model, tp_size, dist.get_communicator())


def is_compile_supported() -> bool:
    return False


__all__ = [
    "OnDevice",
    "__version__",
    "accelerator",
    "add_config_arguments",
    "elasticity",
    "get_accelerator",
    "git_version_info",
    "checkpoint",
    "checkpointing",
    "comm",
    "init_distributed",
    "init_inference",
    "initialize",
    "launcher",
    "moe",
    "ops",
    "pipe",
    "profiling",
    "runtime",
    "sequence",
    "tp_model_init",
    "utils",
    "zero",
]
