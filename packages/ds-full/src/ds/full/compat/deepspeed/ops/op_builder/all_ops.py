"""``deepspeed.ops.op_builder.all_ops.ALL_OPS``: op name -> builder instance."""

from ds.full.compat.deepspeed.ops import op_builder as _ob

ALL_OPS = {
    cls.NAME: cls() for cls in (getattr(_ob, n) for n in _ob.__all__ if n.endswith("Builder"))
}
__op_builders__ = list(ALL_OPS.values())

__all__ = ["ALL_OPS"]
