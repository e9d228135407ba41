"""ds.interfaces: the contracts every ds distribution depends on.

Import the submodules directly (``ds.interfaces.comm``, ``ds.interfaces.registry``, ...); this
module re-exports the error hierarchy and the most used names. Nothing heavy is imported here.
"""

from ds.interfaces.errors import (
    AcceleratorError,
    ApprovalRequiredError,
    AsyncIOError,
    CheckpointError,
    CollectiveTimeoutError,
    CommError,
    ConfigError,
    DsError,
    InferenceError,
    KernelError,
    LaunchError,
    LedgerError,
    ProviderNotFoundError,
)
from ds.interfaces.excepthook import install as _install_excepthook

__version__ = "0.1.0"

_install_excepthook()

__all__ = [
    "AcceleratorError",
    "ApprovalRequiredError",
    "AsyncIOError",
    "CheckpointError",
    "CollectiveTimeoutError",
    "CommError",
    "ConfigError",
    "DsError",
    "InferenceError",
    "KernelError",
    "LaunchError",
    "LedgerError",
    "ProviderNotFoundError",
    "__version__",
]
