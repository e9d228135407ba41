"""DeepSpeed-compatible training config: load, validate, resolve."""

from ds.zero.config.load import UnimplementedConfigWarning, load_config, resolve
from ds.zero.config.model import DsConfig, ResolvedConfig

__all__ = ["DsConfig", "ResolvedConfig", "UnimplementedConfigWarning", "load_config", "resolve"]
