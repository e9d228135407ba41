"""``deepspeed.runtime.zenflow``: ZenFlow's config section and core-split rule.

ds reads the ``zenflow`` section of ``zero_optimization`` (validated as DeepSpeed validates it)
and provides the selective optimizer (``deepspeed.ops.adam.ZenFlowSelectiveAdamW``); its engine
does not run ZenFlow's overlapped optimizer process, and says so when the section is set.
"""
