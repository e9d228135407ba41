"""Model families served by the engine; more plug in through the ``ds.inference_models`` group."""
