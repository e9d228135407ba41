"""``deepspeed.monitor``: DeepSpeed's monitor classes as views of ds's monitors (``ds.monitor``):
the same config sections (``tensorboard``, ``wandb``, ``csv_monitor``, ``comet``), the same
``write_events([(name, value, step), ...])``."""
