"""ds.integrations.lightning: PyTorch Lightning strategies backed by ds."""
