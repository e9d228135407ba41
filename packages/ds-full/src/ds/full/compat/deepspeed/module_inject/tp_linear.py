"""DeepSpeed's tensor-parallel linear layers on ds's (:mod:`ds.parallel.tp.layers`), with
DeepSpeed's layer protocol: ``tp_world_size``/``tp_index``, the split frozen when the layer is
built (``_freeze_partition_sizes``), ``_tp_partition``/``gather_params`` on parameter lists, and
the universal-checkpoint record of every parameter (``_mark_uc_metadata``, the record itself is
:mod:`ds.parallel.tp.uc_layout`'s).

A layer cuts a parameter as sub-parameters along one dimension (a plain split is one
sub-parameter whose per-rank widths are the partition sizes), so cutting, gathering and the
record read the same widths.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ds.full.compat.deepspeed._missing import FeatureNotAvailableError
from ds.full.compat.deepspeed.module_inject.tp_shard import AutoTPMeta, get_shard_size_list
from ds.interfaces.parallel import TP_DIM_ATTR, TP_FUSED_ATTR
from ds.parallel.tp import (
    ColumnParallelLinear,
    RowParallelLinear,
    TPGroup,
    sub_params,
    tp_group_of,
    uc_layout,
)
from ds.parallel.tp._collectives import reduce_from_tp


def tp_group(mp_group: Any, mp_size: int | None = None) -> TPGroup:
    """The TP group as ds's layers see it: ``mp_group`` on the job's communicator (None: the
    whole world); a group of one for ``mp_size=1``, or when no group is named and the job has
    no communicator."""
    if isinstance(mp_group, TPGroup):
        return mp_group
    from ds import comm as dist

    alone = mp_group is None and mp_size is None and not dist.is_initialized()
    if mp_size == 1 or alone:
        return TPGroup(None, mp_group, 1, 0)
    if not dist.is_initialized():
        raise RuntimeError(
            f"a tensor-parallel size of {mp_size} needs the job's communicator; call "
            "deepspeed.init_distributed() first"
        )
    return tp_group_of(mp_group, dist.get_communicator())


class TensorParallel_Layer(nn.Module):
    """DeepSpeed's layer protocol over a ds TP layer. Subclasses set ``_cut_dim`` (the weight
    dimension split), ``_partition_type`` and, for fused weights, ``_subparam_sizes``."""

    _cut_dim = 0
    _partition_type = "column"
    _bias_split = True
    # set by layouts that cannot be merged from their slices (why, in the record)
    _unsupported_uc_reason: str | None = None

    def _setup_tp(self, tp: TPGroup, mp_group: Any, name: str | None, tp_meta: Any) -> None:
        self.mp_group = tp.group if isinstance(mp_group, TPGroup) else mp_group
        self.tp_world_size = tp.size
        self.tp_index = tp.rank
        self.world_size, self.rank = tp.size, tp.rank
        self.name = name if name is not None else getattr(self, "name", None)
        self.tp_meta = tp_meta if tp_meta is not None else AutoTPMeta()
        self.support_training = True

    @staticmethod
    def _shape_before_zero3_partition(param: Any) -> tuple[int, ...]:
        return uc_layout.full_shape(param)

    def _freeze_partition_sizes(self, total_size: int) -> tuple[int, ...]:
        """The split of the cut dimension over the ranks, fixed now: it follows this model's
        heads and grain, and every later cut, gather and record must agree with it."""
        sizes = get_shard_size_list(total_size, self.tp_world_size, self.tp_meta, self.name)
        self._partition_sizes = tuple(sizes)
        self._subparam_sizes: tuple[int, ...] | None = getattr(self, "_subparam_sizes", None)
        self._subparam_shard_widths: Any = None
        if self._subparam_sizes is not None:
            self._subparam_shard_widths = self._widths_of(self._subparam_sizes)
        return self._partition_sizes

    def _widths_of(self, sizes: tuple[int, ...]) -> list[list[int]]:
        from ds.full.compat.deepspeed.module_inject.sub_param_layers import _subparam_shard_widths

        return _subparam_shard_widths(sizes, self.tp_world_size, self.tp_meta, self.name)

    def _layout(self) -> tuple[tuple[int, ...], Any]:
        if self._subparam_sizes is not None:
            return self._subparam_sizes, self._subparam_shard_widths
        return (sum(self._partition_sizes),), [list(self._partition_sizes)]

    @staticmethod
    def _even(widths: Any) -> bool:
        return all(len(set(w)) == 1 for w in widths)

    def _refuse_unsupported(self) -> None:
        if self._unsupported_uc_reason is not None:
            raise RuntimeError(self._unsupported_uc_reason)

    def _param_dim(self, idx: int) -> int | None:
        if idx == 0:
            return self._cut_dim
        return 0 if self._bias_split else None

    @torch.no_grad()
    def _tp_partition(self, params_list: list[Any]) -> None:
        """Replace each parameter's data by this rank's piece (the bias of a row-parallel layer
        stays whole)."""
        if self._unsupported_uc_reason is not None and self.tp_world_size > 1:
            raise FeatureNotAvailableError(
                f"{type(self).__name__}: this tensor-parallel layout is not available in ds "
                f"({self._unsupported_uc_reason})"
            )
        sizes, widths = self._layout()
        for idx, param in enumerate(params_list):
            dim = self._param_dim(idx)
            if param is None or dim is None:
                continue
            piece = sub_params.cut(param.data, dim, sizes, widths, self.tp_index)
            param.data = piece.clone(memory_format=torch.contiguous_format)
            if self.tp_world_size > 1:
                setattr(param, TP_DIM_ATTR, dim)
                if len(sizes) > 1 and len(set(sizes)) == 1 and self._even(widths):
                    setattr(param, TP_FUSED_ATTR, len(sizes))

    @torch.no_grad()
    def gather_params(self, params_list: list[Any]) -> None:
        """Put every rank's pieces back together (a collective over the TP group)."""
        self._refuse_unsupported()
        _, widths = self._layout()
        for idx, param in enumerate(params_list):
            dim = self._param_dim(idx)
            if param is None or dim is None:
                continue
            param.data = sub_params.gather(param.data, dim, widths, self.tp).contiguous()

    def _record(self, param: Any, logical: tuple[int, ...], dim: int | None, **extra: Any) -> None:
        sizes = self._subparam_sizes
        fields: dict[str, Any] = {
            "partition_type": self._partition_type,
            "partition_dim": dim,
            "logical_shape": logical,
            "original_shape": logical,
            "unsupported_reason": self._unsupported_uc_reason,
        }
        if self._unsupported_uc_reason is None:
            fields["output_shape"] = (logical[0],) if len(logical) > 1 else logical
            fields["target_partition_shape"] = tuple(param.shape)
            if dim is not None and sizes is not None:
                spec = list(logical)
                spec[dim] = tuple(sizes)
                fields.update(
                    sub_param_shape=tuple(spec),
                    sub_param_sizes=sizes,
                    sub_param_shard_widths=self._subparam_shard_widths,
                )
            elif dim is not None:
                fields["partition_sizes"] = self._partition_sizes
        fields.update(extra)
        uc_layout.mark(param, **fields)

    def _mark_uc_metadata(self) -> None:
        """Record how each parameter is cut, from the split frozen at build time."""
        self._record(self.weight, self._orig_weight_shape, self._cut_dim)
        if self.bias is not None:
            shape = self._orig_bias_shape
            if self._bias_split:
                self._record(self.bias, shape, 0, is_bias=True)
            else:
                self._record(self.bias, shape, None, is_bias=True, replicated=True)

    def _build(self, module: nn.Module, mp_group: Any, skip: bool, kw: dict[str, Any]) -> TPGroup:
        # Runs before the ds layer's constructor: the split has to be frozen from the whole
        # weight's shape before anything is cut. Only plain attributes are set here, which
        # nn.Module allows before its own __init__.
        tp = tp_group(mp_group)
        self._setup_tp(tp, mp_group, kw.get("name"), kw.get("tp_meta"))
        self._orig_weight_shape = uc_layout.full_shape(module.weight)
        bias = getattr(module, "bias", None)
        self._orig_bias_shape = None if bias is None else uc_layout.full_shape(bias)
        self._freeze_partition_sizes(self._orig_weight_shape[self._cut_dim])
        self._skip_partition = skip or tp.size == 1
        return tp

    def _finish(self, module: nn.Module) -> None:
        if not self._skip_partition:
            # fresh parameters: a weight the original module shares stays whole there
            self.weight = nn.Parameter(module.weight.detach(), module.weight.requires_grad)
            if self.bias is not None:
                self.bias = nn.Parameter(self.bias.detach(), self.bias.requires_grad)
            self._tp_partition([self.weight, self.bias])
        self._mark_uc_metadata()


class LinearLayer(TensorParallel_Layer, ColumnParallelLinear):
    """Column parallel: output features split, ``gather_output`` all-gathers the result."""

    def __init__(
        self,
        module: nn.Module,
        mp_group: Any = None,
        skip_partition: bool = False,
        gather_output: bool = False,
        *,
        fused: int = 1,
        **kw: Any,
    ) -> None:
        if fused > 1:  # fused q,k,v (GPT-2): equal segments, each split over the ranks
            self._subparam_sizes = (uc_layout.full_shape(module.weight)[0] // fused,) * fused
        tp = self._build(module, mp_group, skip_partition, kw)
        ColumnParallelLinear.__init__(
            self, module.weight, module.bias, tp, gather_output=gather_output, fused=fused
        )
        self._finish(module)
        self.out_features = self._orig_weight_shape[0]
        self.local_out_features = self._partition_sizes[tp.rank]


class LinearAllreduce(TensorParallel_Layer, RowParallelLinear):
    """Row parallel: input features split, partial outputs all-reduced, bias added once."""

    _cut_dim = 1
    _partition_type = "row"
    _bias_split = False

    def __init__(self, module: nn.Module, mp_group: Any = None, **kw: Any) -> None:
        tp = self._build(module, mp_group, False, kw)
        RowParallelLinear.__init__(self, module.weight, module.bias, tp, transposed=False)
        self._finish(module)
        self.in_features = self._orig_weight_shape[1]
        self.local_in_features = self._partition_sizes[tp.rank]


class LmHeadLinearAllreduce(LinearAllreduce):
    """A row-parallel LM head fed the whole hidden state: each rank reads its own columns of the
    input, at the split frozen when the layer was built."""

    def __init__(self, module: nn.Module, mp_group: Any = None, **kw: Any) -> None:
        self.name = "lm_head"
        # its own copy, so a tied embedding is not cut with it
        module.weight = nn.Parameter(module.weight.detach().clone())
        if getattr(module, "bias", None) is not None:
            module.bias = nn.Parameter(module.bias.detach().clone())
        super().__init__(module, mp_group, **{**kw, "name": "lm_head"})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sizes = self._partition_sizes
        if sum(sizes) != x.shape[-1]:
            raise AssertionError(
                f"lm_head was partitioned for {sum(sizes)} input features, got {x.shape[-1]}"
            )
        start = sum(sizes[: self.tp_index])
        y = torch.matmul(x[..., start : start + sizes[self.tp_index]], self.weight.t())
        y = reduce_from_tp(y, self.tp)
        return y if self.bias is None else y + self.bias


# Yuan's shared-QK attention gives each rank noncontiguous groups of heads; ds does not train
# that layout, and no slice record can describe it.
_YUAN = (
    "Yuan shared-QK tensor parallelism selects noncontiguous head groups that universal "
    "checkpoint conversion cannot currently describe"
)


class Yuan_LinearLayer(LinearLayer):
    _unsupported_uc_reason = _YUAN


class Yuan_LinearAllreduce(LinearAllreduce):
    _unsupported_uc_reason = _YUAN


__all__ = [
    "LinearAllreduce",
    "LinearLayer",
    "LmHeadLinearAllreduce",
    "TensorParallel_Layer",
    "Yuan_LinearAllreduce",
    "Yuan_LinearLayer",
    "tp_group",
]
