"""``deepspeed.runtime.fp16``: DeepSpeed's fp16 optimizer wrappers. ds's engine steps its own
fp32 masters at every ZeRO stage (loss scaling in ``ds.zero.loss_scaler``), so the wrappers are
names that code can import and test against; an engine's optimizer is never one of them."""
