"""``deepspeed.module_inject.layers``' universal-checkpoint records: what the layers record is
what ds.checkpoint merges the slices with and cuts them back by."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from ds.checkpoint.universal_slice import autotp_rank_slice
from ds.checkpoint.universal_tp import merge_tp_param
from ds.full.compat.deepspeed._missing import FeatureNotAvailableError
from ds.full.compat.deepspeed.module_inject.layers import (
    LinearAllreduce,
    LinearLayer,
    SubParamLinearLayer,
    Yuan_LinearLayer,
    collect_autotp_universal_checkpoint_info,
    fused_LinearLayer,
)
from ds.interfaces.tp_layout import UC_META_ATTR
from ds.parallel.tp import TPGroup


def _ranks(make: object, base: nn.Module, tp: int) -> list[nn.Module]:
    out = []
    for rank in range(tp):
        model = nn.Module()
        model.layer = make(copy.deepcopy(base), TPGroup(None, None, tp, rank))  # type: ignore[operator]
        out.append(model)
    return out


@pytest.mark.parametrize(
    ("make", "in_out"),
    [
        (lambda m, g: SubParamLinearLayer(m, g, shape=((6, 3, 3), -1), name="qkv"), (5, 12)),
        (lambda m, g: LinearLayer(m, g, name="lm_head"), (5, 11)),
        (lambda m, g: LinearAllreduce(m, g, name="o_proj"), (11, 5)),
    ],
    ids=["uneven-sub-params", "uneven-column", "uneven-row"],
)
def test_slices_merge_and_cut_back_by_the_layers_records(
    make: object, in_out: tuple[int, int]
) -> None:
    torch.manual_seed(0)
    base = nn.Linear(*in_out)
    ranks = _ranks(make, base, 2)
    info = collect_autotp_universal_checkpoint_info(ranks[0])
    for name, whole in base.named_parameters():
        held = [dict(m.named_parameters())[f"layer.{name}"] for m in ranks]
        merged = merge_tp_param(info, f"layer.{name}", [p.detach() for p in held], set())
        assert merged is not None and torch.equal(merged["param"].reshape(whole.shape), whole)
        for rank, p in enumerate(held):
            piece = autotp_rank_slice(getattr(p, UC_META_ATTR), whole.detach(), rank, 2)
            assert piece is not None and torch.equal(piece, p.detach().flatten())


def test_layouts_ds_does_not_split_are_refused_at_tp_above_one() -> None:
    class CodeGenBlock(nn.Module):
        pass

    group = TPGroup(None, None, 2, 0)
    with pytest.raises(FeatureNotAvailableError, match="noncontiguous head groups"):
        Yuan_LinearLayer(nn.Linear(4, 4), group)
    with pytest.raises(FeatureNotAvailableError, match="interleaves"):
        fused_LinearLayer(nn.Linear(4, 12), group, fused_module=CodeGenBlock())
