"""Tiled linear layers: one ``in_features x out_features`` linear built as a grid of smaller ones.

Under stage 3 each tile is its own module, gathered only while it runs, so the largest whole
weight ever resident is one tile's rather than the layer's: a layer too large to gather at once
still trains. Tile ``[o][i]`` maps input columns ``in_parts[i]:in_parts[i+1]`` to output rows
``out_parts[o]:out_parts[o+1]``; the last input tile of each output row carries that row's bias.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch

from ds.zero.init import GatheredParameters


def uniform_bounds(num_items: int, num_parts: int) -> list[int]:
    """``num_parts + 1`` bounds splitting ``num_items`` into parts whose sizes differ by at most
    one, the larger parts first."""
    if num_items <= num_parts:
        return [min(p, num_items) for p in range(num_parts + 1)]
    size, extra = divmod(num_items, num_parts)
    return [p * size + min(p, extra) for p in range(num_parts + 1)]


class TiledLinear(torch.nn.Module):
    """A drop-in for ``torch.nn.Linear`` made of ``out_splits x in_splits`` tiles.

    ``input_is_already_split``: ``forward`` receives the ``in_splits`` input chunks; with
    ``combine_out_splits=False`` it returns the per-row outputs instead of their concatenation.
    ``linear_cls`` builds each tile (extra keyword arguments go to it); ``init_linear`` copies a
    whole linear's weights into the tiles.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        in_splits: int = 1,
        out_splits: int = 1,
        input_is_already_split: bool = False,
        combine_out_splits: bool = True,
        linear_cls: type[torch.nn.Module] = torch.nn.Linear,
        init_linear: torch.nn.Module | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        if not 1 <= in_splits <= in_features:
            raise RuntimeError(f"in_splits must be in [1, {in_features}], got {in_splits}")
        if not 1 <= out_splits <= out_features:
            raise RuntimeError(f"out_splits must be in [1, {out_features}], got {out_splits}")
        self.in_features, self.out_features, self.use_bias = in_features, out_features, bias
        self.in_splits, self.out_splits = in_splits, out_splits
        self.input_is_already_split = input_is_already_split
        self.combine_out_splits = combine_out_splits
        self.in_parts = uniform_bounds(in_features, in_splits)
        self.out_parts = uniform_bounds(out_features, out_splits)
        self.linears = torch.nn.ModuleList()
        for o in range(out_splits):
            rows = self.out_parts[o + 1] - self.out_parts[o]
            row = torch.nn.ModuleList()
            for i in range(in_splits):
                cols = self.in_parts[i + 1] - self.in_parts[i]
                row.append(linear_cls(cols, rows, bias=bias and i == in_splits - 1, **kwargs))
            self.linears.append(row)
        if init_linear is not None:
            self.copy_params_from(init_linear)

    def forward(self, input_: Any) -> Any:
        if self.in_splits == 1:
            inputs = [input_]
        elif self.input_is_already_split:
            if len(input_) != self.in_splits:
                raise ValueError(f"expected {self.in_splits} input chunks, got {len(input_)}")
            inputs = input_
        else:
            bounds = uniform_bounds(input_.shape[-1], self.in_splits)
            sizes = [b - a for a, b in itertools.pairwise(bounds)]
            inputs = self._split_global_input(input_, sizes)
        outputs = []
        for o in range(self.out_splits):
            acc = None
            for i in range(self.in_splits):
                local = self.linears[o][i](inputs[i])
                acc = self._reduce_local_output(in_id=i, out_id=o, current_out=acc, new_out=local)
            outputs.append(acc)
        return self._combine_output_splits(outputs) if self.combine_out_splits else outputs

    def _split_global_input(self, input: torch.Tensor, split_sizes: Sequence[int]) -> Any:
        """Chunks of ``input`` along its last dimension (override for other input types)."""
        return torch.split(input, list(split_sizes), dim=-1)

    def _reduce_local_output(self, in_id: int, out_id: int, current_out: Any, new_out: Any) -> Any:
        """Sum one tile's output into its row's (override for other output types)."""
        return new_out.clone() if current_out is None else current_out + new_out

    def _combine_output_splits(self, outputs: list[Any]) -> Any:
        return torch.cat(outputs, dim=-1)

    @torch.no_grad()
    def copy_params_from(self, other: torch.nn.Module) -> None:
        """Copy a whole linear's weight (and bias) into the tiles; under stage 3 a collective, and
        data-parallel rank 0's values win."""
        weight, bias = other.weight, getattr(other, "bias", None)
        if tuple(weight.shape) != (self.out_features, self.in_features):
            raise ValueError(
                f"weight of shape {tuple(weight.shape)} does not fit a "
                f"{self.in_features}->{self.out_features} tiled linear"
            )
        if self.use_bias != (bias is not None):
            raise ValueError(f"bias={self.use_bias} here but the source linear has bias={bias}")
        for o in range(self.out_splits):
            r0, r1 = self.out_parts[o], self.out_parts[o + 1]
            for i in range(self.in_splits):
                tile = self.linears[o][i]
                c0, c1 = self.in_parts[i], self.in_parts[i + 1]
                with GatheredParameters(tile.weight, modifier_rank=0):
                    tile.weight.copy_(weight[r0:r1, c0:c1])
                if tile.bias is not None:
                    with GatheredParameters(tile.bias, modifier_rank=0):
                        tile.bias.copy_(bias[r0:r1])


class TiledLinearReturnBias(TiledLinear):
    """Tiles that return ``(output, bias)`` (Megatron-LM's linears): outputs are summed, the
    returned biases are not, and both are concatenated per row."""

    def _reduce_local_output(self, in_id: int, out_id: int, current_out: Any, new_out: Any) -> Any:
        old, old_bias = current_out if current_out is not None else (None, None)
        tensor, bias = new_out
        tensor = super()._reduce_local_output(in_id, out_id, old, tensor)
        return tensor, old_bias if bias is None else bias

    def _combine_output_splits(self, outputs: list[Any]) -> Any:
        tensor = super()._combine_output_splits([t for t, _ in outputs])
        biases = [b for _, b in outputs if b is not None]
        return tensor, super()._combine_output_splits(biases) if biases else None


__all__ = ["TiledLinear", "TiledLinearReturnBias", "uniform_bounds"]
