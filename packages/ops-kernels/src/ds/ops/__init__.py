"""ds.ops: prebuilt native kernels (CPU optimizers, quantizers, async I/O) and Triton kernels."""
