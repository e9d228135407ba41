"""DeepSpeed's tensor-parallel layers for fused weights, cut per sub-parameter
(:mod:`ds.parallel.tp.sub_params`): a layer-spec ``shape`` (``SubParamLinearLayer``,
``SubParamLinearAllreduce``), a gate/up pair (``GateUpPack_LinearLayer``) and a block's fused
q,k,v (``fused_LinearLayer``, the packing from :mod:`ds.parallel.tp.fused_qkv`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ds.full.compat.deepspeed.module_inject.tp_linear import (
    LinearLayer,
    TensorParallel_Layer,
)
from ds.full.compat.deepspeed.module_inject.tp_shard import get_shard_size_list
from ds.parallel.tp import ColumnParallelLinear, RowParallelLinear, sub_params
from ds.parallel.tp.fused_qkv import NOT_PER_SUB_PARAM, fused_kind, fused_sub_param_sizes


def _subparam_shard_widths(
    subparam_sizes: Sequence[int], tp_world_size: int, meta: Any = None, name: str | None = None
) -> list[list[int]]:
    """Per sub-parameter, the width each rank holds: the split AutoTP makes of any dimension
    (whole heads, else whole grains), so a fused attention weight is cut on head boundaries.
    Ranks beyond the head count hold a width of 0."""
    return sub_params.shard_widths(
        subparam_sizes,
        tp_world_size,
        lambda size: get_shard_size_list(size, tp_world_size, meta, name),
    )


class _SpecLayer(TensorParallel_Layer):
    """A weight viewed through a layer spec's ``shape`` and cut along ``partition_dim`` of that
    view; the bias shares the view's output dimensions."""

    def _build_spec(
        self, module: nn.Module, mp_group: Any, shape: Any, partition_dim: int, kw: dict[str, Any]
    ) -> Any:
        tp = self._build(module, mp_group, False, kw)
        self.shape, self.partition_dim = shape, partition_dim
        logical, output, sizes, bias_dim = sub_params.resolve_sub_param_shape(
            self._orig_weight_shape, shape, partition_dim, self.name
        )
        self._logical_shape, self._output_shape, self._bias_partition_dim = (
            logical,
            output,
            bias_dim,
        )
        self._subparam_sizes = sizes
        self._subparam_shard_widths = self._widths_of(sizes or (logical[partition_dim],))
        if self._orig_bias_shape is not None and math.prod(self._orig_bias_shape) != math.prod(
            output
        ):
            raise ValueError(
                f"AutoTP layer '{self.name}': bias of {self._orig_bias_shape} does not match the "
                f"output shape {output}"
            )
        return tp

    def _sizes(self) -> tuple[int, ...]:
        return self._subparam_sizes or (self._logical_shape[self.partition_dim],)

    def _split_bias(self) -> bool:
        return self._bias_partition_dim is not None and self._partition_type == "column"

    @torch.no_grad()
    def _tp_partition(self, params_list: list[Any]) -> None:
        sizes, widths = self._sizes(), self._subparam_shard_widths
        for idx, param in enumerate(params_list):
            if param is None:
                continue
            if idx == 0:
                view = param.data.reshape(self._logical_shape)
                piece = sub_params.cut(view, self.partition_dim, sizes, widths, self.tp_index)
                piece = piece.reshape(math.prod(piece.shape[:-1]), piece.shape[-1])
            elif self._split_bias():
                view = param.data.reshape(self._output_shape)
                piece = sub_params.cut(view, self._bias_partition_dim, sizes, widths, self.tp_index)
                piece = piece.reshape(-1)
            else:
                continue
            param.data = piece.clone(memory_format=torch.contiguous_format)

    @torch.no_grad()
    def gather_params(self, params_list: list[Any]) -> None:
        widths = self._subparam_shard_widths
        for idx, param in enumerate(params_list):
            if param is None or (idx > 0 and not self._split_bias()):
                continue
            logical = self._logical_shape if idx == 0 else self._output_shape
            dim = self.partition_dim if idx == 0 else self._bias_partition_dim
            held = list(logical)
            held[dim] = sum(w[self.tp_index] for w in widths)
            whole = sub_params.gather(param.data.reshape(held), dim, widths, self.tp)
            shape = self._orig_weight_shape if idx == 0 else self._orig_bias_shape
            param.data = whole.reshape(shape).contiguous()

    def _mark_uc_metadata(self) -> None:
        sizes, widths = self._subparam_sizes, self._subparam_shard_widths
        self._record(
            self.weight,
            self._logical_shape,
            self.partition_dim,
            output_shape=self._output_shape,
            original_shape=self._orig_weight_shape,
            sub_param_shape=self.shape,
            sub_param_sizes=sizes,
            sub_param_shard_widths=widths,
            target_partition_shape=tuple(self.weight.shape),
            partition_sizes=None,
        )
        if self.bias is None:
            return
        if not self._split_bias():
            self._record(
                self.bias,
                self._orig_bias_shape,
                None,
                is_bias=True,
                replicated=True,
                target_partition_shape=tuple(self.bias.shape),
            )
            return
        spec = list(self._output_shape)
        if sizes is not None:
            spec[self._bias_partition_dim] = tuple(sizes)
        self._record(
            self.bias,
            self._output_shape,
            self._bias_partition_dim,
            original_shape=self._orig_bias_shape,
            sub_param_shape=tuple(spec),
            sub_param_sizes=sizes,
            sub_param_shard_widths=widths,
            target_partition_shape=tuple(self.bias.shape),
            partition_sizes=None,
            is_bias=True,
        )


class SubParamLinearLayer(_SpecLayer, ColumnParallelLinear):
    """Column parallel over a fused weight: ``shape=(3, -1)`` three equal sub-parameters,
    ``((q, k, v), -1)`` unequal ones, each cut over the ranks."""

    def __init__(
        self, module: nn.Module, mp_group: Any, shape: Any, partition_dim: int = 0, **kw: Any
    ) -> None:
        tp = self._build_spec(module, mp_group, shape, partition_dim, kw)
        ColumnParallelLinear.__init__(self, module.weight, module.bias, tp)
        self._finish(module)
        self.out_features, self.in_features = self._orig_weight_shape
        self.local_out_features = self.weight.shape[0]


class SubParamLinearAllreduce(_SpecLayer, RowParallelLinear):
    """Row parallel over a fused weight (output all-reduced); the bias stays whole."""

    _partition_type = "row"

    def __init__(
        self, module: nn.Module, mp_group: Any, shape: Any, partition_dim: int = 1, **kw: Any
    ) -> None:
        tp = self._build_spec(module, mp_group, shape, partition_dim, kw)
        RowParallelLinear.__init__(self, module.weight, module.bias, tp, transposed=False)
        self._finish(module)
        self.out_features, self.in_features = self._orig_weight_shape
        self.local_in_features = self.weight.shape[-1]


class GateUpPack_LinearLayer(LinearLayer):
    """ChatGLM's packed gate and up projections: two halves, each cut over the ranks (split
    as an MLP, never by heads)."""

    def __init__(self, module: nn.Module, mp_group: Any = None, **kw: Any) -> None:
        half = module.weight.shape[0] // 2
        self._subparam_sizes = (half, half)
        super().__init__(module, mp_group, **kw)

    def _widths_of(self, sizes: tuple[int, ...]) -> list[list[int]]:
        return _subparam_shard_widths(sizes, self.tp_world_size, self.tp_meta, "mlp")


class fused_LinearLayer(LinearLayer):
    """A block's fused q,k,v projection, cut per sub-parameter as the block packs it; CodeGen's
    and GPTBigCode's packings are not (their record says so, and ds does not split them)."""

    def __init__(
        self, module: nn.Module, mp_group: Any = None, skip_partition: bool = False, **kw: Any
    ) -> None:
        block = kw.get("fused_module")
        if block is None:
            raise ValueError(
                "fused_LinearLayer needs the block holding the fused weight (fused_module)"
            )
        meta = kw.get("tp_meta")
        sizes = fused_sub_param_sizes(
            fused_kind(block),
            tuple(module.weight.shape),
            getattr(meta, "num_kv_heads", None),
            getattr(meta, "n_embd", None),
            getattr(meta, "num_attention_heads", None),
        )
        self._subparam_sizes = sizes
        if sizes is None:
            self._unsupported_uc_reason = NOT_PER_SUB_PARAM
        super().__init__(module, mp_group, skip_partition, **kw)

    def _widths_of(self, sizes: tuple[int, ...]) -> list[list[int]]:
        return _subparam_shard_widths(sizes, self.tp_world_size, self.tp_meta, None)


__all__ = [
    "GateUpPack_LinearLayer",
    "SubParamLinearAllreduce",
    "SubParamLinearLayer",
    "fused_LinearLayer",
]
