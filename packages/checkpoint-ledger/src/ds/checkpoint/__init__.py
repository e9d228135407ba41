"""ds.checkpoint: Resharding checkpoints, a tamper-evident run ledger and a readiness gate."""
