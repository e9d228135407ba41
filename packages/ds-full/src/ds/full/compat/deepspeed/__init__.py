"""The ``deepspeed`` names that training scripts use, mapped onto ds.

``import ds.full.compat.deepspeed as deepspeed`` (or ``ds.full.compat.install()`` and then
``import deepspeed``). See docs/integrations.md for the full table.
"""

from __future__ import annotations

import argparse
from typing import Any

from ds.full.compat.deepspeed import accelerator, checkpointing, comm, ops, runtime, zero
from ds.full.training import init_distributed, initialize

__version__ = "0.1.0+ds"
__version_major__, __version_minor__, __version_patch__ = 0, 1, 0


def _engine_class() -> Any:
    from ds.zero.engine import ZeroEngine

    return ZeroEngine


def __getattr__(name: str) -> Any:
    # The engine class is imported on first use so that importing the shim stays light.
    if name in ("DeepSpeedEngine", "DeepSpeedHybridEngine", "PipelineEngine"):
        if name != "DeepSpeedEngine":
            raise AttributeError(
                f"deepspeed.{name} has no ds equivalent (ds trains data-parallel ZeRO only)"
            )
        return _engine_class()
    raise AttributeError(f"module 'deepspeed' (ds compatibility shim) has no attribute {name!r}")


def add_config_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``--deepspeed``/``--deepspeed_config`` (and the old ``--deepscale`` spellings)."""
    group = parser.add_argument_group("DeepSpeed", "DeepSpeed configurations")
    group.add_argument("--deepspeed", default=False, action="store_true", help="enable ds")
    group.add_argument("--deepspeed_config", default=None, type=str, help="ds JSON config path")
    group.add_argument("--deepscale", default=False, action="store_true", help=argparse.SUPPRESS)
    group.add_argument("--deepscale_config", default=None, type=str, help=argparse.SUPPRESS)
    return parser


def is_compile_supported() -> bool:
    return False


__all__ = [
    "__version__",
    "accelerator",
    "add_config_arguments",
    "checkpointing",
    "comm",
    "init_distributed",
    "initialize",
    "ops",
    "runtime",
    "zero",
]
