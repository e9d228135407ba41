"""A stand-in for the parts of torchvision the DeepSpeedExamples scripts use (see README.md)."""

from torchvision import datasets, models, transforms

__all__ = ["datasets", "models", "transforms"]
