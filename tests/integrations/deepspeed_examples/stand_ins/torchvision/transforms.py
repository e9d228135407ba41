"""The tensor transforms the examples compose (on HWC uint8 images, as CIFAR-10's arrays)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F


class Compose:
    def __init__(self, transforms: Sequence[Callable[[Any], Any]]) -> None:
        self.transforms = list(transforms)

    def __call__(self, x: Any) -> Any:
        for t in self.transforms:
            x = t(x)
        return x


def _chw(x: torch.Tensor) -> torch.Tensor:
    """Images arrive as HWC (CIFAR-10's arrays); the transforms work on CHW."""
    return x if x.shape[0] in (1, 3) else x.permute(2, 0, 1)


class ToTensor:
    """uint8 image -> CHW float in [0, 1]."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return _chw(x).float().div(255.0)


class _ToSize:
    """A transform of a CHW image to ``size`` that depends on the image's height and width."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = _chw(x)
        h, w = x.shape[-2:]
        return self._apply(x, h, w)

    def _apply(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        raise NotImplementedError


class Resize(_ToSize):
    """Scale the shorter side to ``size`` (bilinear)."""

    def _apply(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        scale = self.size / min(h, w)
        out = F.interpolate(
            x[None].float(), size=(round(h * scale), round(w * scale)), mode="bilinear"
        )
        return out[0] if x.is_floating_point() else out[0].round().clamp(0, 255).to(x.dtype)


class CenterCrop(_ToSize):
    def _apply(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        top, left = (h - self.size) // 2, (w - self.size) // 2
        return x[..., top : top + self.size, left : left + self.size]


class Normalize:
    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        self.mean = torch.tensor(mean)[:, None, None]
        self.std = torch.tensor(std)[:, None, None]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std
