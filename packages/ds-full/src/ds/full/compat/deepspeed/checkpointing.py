"""``deepspeed.checkpointing`` is ``deepspeed.runtime.activation_checkpointing.checkpointing``
(one module, as in DeepSpeed), on ds.zero's activation checkpointing."""

import sys

from ds.full.compat.deepspeed.runtime.activation_checkpointing import checkpointing as _module

sys.modules[__name__] = _module
