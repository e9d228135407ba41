"""``deepspeed.elasticity.config``: the ``elasticity`` section, checked, and its errors."""

from __future__ import annotations

from typing import Any

from ds.full.compat.deepspeed.elasticity import constants as C
from ds.interfaces.errors import ConfigError


class ElasticityError(ConfigError):
    """An elastic batch size cannot be computed for this config or world."""


class ElasticityConfigError(ElasticityError):
    """The ``elasticity`` section is missing, disabled or invalid."""


class ElasticityIncompatibleWorldSize(ElasticityError):
    """The world size is not one of the config's valid GPU counts."""


def _positive_ints(name: str, value: Any) -> list[int]:
    if not isinstance(value, list):
        raise ElasticityConfigError(
            f"elasticity.{name} must be a list of positive integers, got {value!r}"
        )
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value):
        raise ElasticityConfigError(
            f"elasticity.{name} must hold positive integers only, got {value!r}"
        )
    return list(value)


class ElasticityConfig:
    """The section's values with DeepSpeed's defaults; ``max_train_batch_size`` and
    ``micro_batch_sizes`` are required once ``enabled`` is true."""

    def __init__(self, param_dict: dict[str, Any]) -> None:
        self.enabled = bool(param_dict.get(C.ENABLED, C.ENABLED_DEFAULT))
        if self.enabled:
            for key in (C.MAX_ACCEPTABLE_BATCH_SIZE, C.MICRO_BATCHES):
                if key not in param_dict:
                    raise ElasticityConfigError(
                        f"elasticity is enabled but elasticity.{key} is missing; add it"
                    )
        self.max_acceptable_batch_size = param_dict.get(
            C.MAX_ACCEPTABLE_BATCH_SIZE, C.MAX_ACCEPTABLE_BATCH_SIZE_DEFAULT
        )
        self.micro_batches = _positive_ints(
            C.MICRO_BATCHES, param_dict.get(C.MICRO_BATCHES, C.MICRO_BATCHES_DEFAULT)
        )
        self.min_gpus = param_dict.get(C.MIN_GPUS, C.MIN_GPUS_DEFAULT)
        self.max_gpus = param_dict.get(C.MAX_GPUS, C.MAX_GPUS_DEFAULT)
        if self.min_gpus < 1 or self.max_gpus < 1:
            raise ElasticityConfigError(
                f"elasticity.min_gpus and max_gpus must be >= 1, got {self.min_gpus} and "
                f"{self.max_gpus}"
            )
        if self.min_gpus > self.max_gpus:
            raise ElasticityConfigError(
                f"elasticity.min_gpus ({self.min_gpus}) is above max_gpus ({self.max_gpus})"
            )
        self.model_parallel_size = param_dict.get(
            C.MODEL_PARALLEL_SIZE, C.MODEL_PARALLEL_SIZE_DEFAULT
        )
        if self.model_parallel_size < 1:
            raise ElasticityConfigError(
                f"elasticity.model_parallel_size must be >= 1, got {self.model_parallel_size}"
            )
        self.num_gpus_per_node = param_dict.get(C.NUM_GPUS_PER_NODE, C.NUM_GPUS_PER_NODE_DEFAULT)
        if self.num_gpus_per_node < 1:
            raise ElasticityConfigError(
                f"elasticity.num_gpus_per_node must be >= 1, got {self.num_gpus_per_node}"
            )
        self.min_time = param_dict.get(C.MIN_TIME, C.MIN_TIME_DEFAULT)
        if self.min_time < 0:
            raise ElasticityConfigError(f"elasticity.min_time must be >= 0, got {self.min_time}")
        self.version = param_dict.get(C.VERSION, C.VERSION_DEFAULT)
        self.prefer_larger_batch_size = param_dict.get(
            C.PREFER_LARGER_BATCH, C.PREFER_LARGER_BATCH_DEFAULT
        )
        self.ignore_non_elastic_batch_info = param_dict.get(
            C.IGNORE_NON_ELASTIC_BATCH_INFO, C.IGNORE_NON_ELASTIC_BATCH_INFO_DEFAULT
        )

    def __repr__(self) -> str:
        return f"ElasticityConfig({vars(self)})"


__all__ = [
    "ElasticityConfig",
    "ElasticityConfigError",
    "ElasticityError",
    "ElasticityIncompatibleWorldSize",
]
