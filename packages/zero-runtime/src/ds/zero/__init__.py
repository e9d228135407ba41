"""ds.zero: The ds training engine: config, ZeRO stages 0-3, offload, precision."""
