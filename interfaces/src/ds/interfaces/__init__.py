"""ds.interfaces: the contracts every ds distribution depends on.

Import the submodules directly (``ds.interfaces.comm``, ``ds.interfaces.registry``, ...); this
module re-exports the error hierarchy and the most used names. Nothing heavy is imported here.
"""

from ds.interfaces import errors as _errors
from ds.interfaces.errors import *  # noqa: F403  (the error hierarchy, as errors.__all__ lists it)
from ds.interfaces.excepthook import install as _install_excepthook

__version__ = "0.1.0"

_install_excepthook()

__all__ = [*_errors.__all__, "__version__"]
