"""ds.accel: Accelerator implementations for ds: cpu, cuda, mps, plug-in others."""
