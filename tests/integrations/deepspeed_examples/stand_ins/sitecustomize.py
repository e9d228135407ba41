"""On a CPU-only torch, make ``torch.cuda.set_device`` a no-op (see README.md)."""

try:
    import torch

    if not torch.cuda.is_available():
        torch.cuda.set_device = lambda device: None
except ImportError:
    pass
