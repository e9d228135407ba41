"""``deepspeed.launcher``: DeepSpeed's launcher (``runner``: the ``deepspeed`` command, run by
``ds run``) and its constants."""

from ds.full.compat.deepspeed.launcher import multinode_runner, runner

__all__ = ["multinode_runner", "runner"]
