"""``deepspeed.launcher``: constants of DeepSpeed's launcher that integrations read."""

from ds.full.compat.deepspeed.launcher import runner

__all__ = ["runner"]
