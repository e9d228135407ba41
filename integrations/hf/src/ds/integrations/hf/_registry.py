"""The composition root's functions, reached through the ``ds.initialize`` entry points
(ds-full provides them) so that this package imports only ds.interfaces among ds.*."""

from __future__ import annotations

from typing import Any

from ds.interfaces import registry


def provided(name: str) -> Any:
    """``initialize`` (``"default"``), ``zero_init``, ``load_state_dict_into_shards``,
    ``consolidated_state_dict``, ``gathered_parameters``; a missing ds-full names itself."""
    return registry.get(registry.INITIALIZE, name)
