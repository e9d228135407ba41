"""The former name of :mod:`ds.zero.activation_checkpointing`, kept so existing imports work.

``ds.zero.checkpointing`` read as if it were about checkpoint files (that is ``ds.checkpoint``);
the module is the same object under both names, so configuration set through either is shared.
"""

import sys

from ds.zero import activation_checkpointing as _activation_checkpointing

sys.modules[__name__] = _activation_checkpointing
