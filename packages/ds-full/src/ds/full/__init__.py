"""ds.full: the composition root that wires every ds distribution together.

``import ds.full as ds; engine, optimizer, loader, scheduler = ds.initialize(model=..., config=...)``
"""

from ds.full.features import feature_report, version
from ds.full.training import init_distributed, initialize

__all__ = ["feature_report", "init_distributed", "initialize", "version"]
