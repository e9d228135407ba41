"""``deepspeed.comm`` -> ``ds.comm`` (torch.distributed-compatible collectives)."""

from __future__ import annotations

from typing import Any

import ds.comm as _comm


def __getattr__(name: str) -> Any:
    return getattr(_comm, name)
