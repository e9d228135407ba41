"""``deepspeed.ops.aio``: the async file I/O op's builder (ds's prebuilt ``ds.ops.aio``)."""

from __future__ import annotations

from ds.full.compat.deepspeed.ops.op_builder import AsyncIOBuilder

__all__ = ["AsyncIOBuilder"]
