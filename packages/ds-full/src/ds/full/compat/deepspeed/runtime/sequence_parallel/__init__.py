"""``deepspeed.runtime.sequence_parallel``: Ulysses for transformers models (ALST)."""
