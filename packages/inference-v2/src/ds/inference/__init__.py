"""ds.inference: Ragged-batching LLM inference engine with a blocked KV cache."""
