"""``deepspeed.elasticity``: elastic batch sizes (``compute_elastic_config``)."""

from ds.full.compat.deepspeed.elasticity import config, constants
from ds.full.compat.deepspeed.elasticity.constants import ELASTICITY, ENABLED, ENABLED_DEFAULT
from ds.full.compat.deepspeed.elasticity.elasticity import (
    compute_elastic_config,
    elasticity_enabled,
    ensure_immutable_elastic_config,
)


def is_torch_elastic_compatible() -> bool:
    return True  # every torch ds supports has torch.distributed.elastic


__all__ = [
    "ELASTICITY",
    "ENABLED",
    "ENABLED_DEFAULT",
    "compute_elastic_config",
    "config",
    "constants",
    "elasticity_enabled",
    "ensure_immutable_elastic_config",
    "is_torch_elastic_compatible",
]
