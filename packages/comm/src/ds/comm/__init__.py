"""ds.comm: torch.distributed-compatible collectives with logging, coalescing and a hang watchdog."""
