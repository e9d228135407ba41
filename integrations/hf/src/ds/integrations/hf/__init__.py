"""ds.integrations.hf: Hugging Face Transformers integration for ds."""
