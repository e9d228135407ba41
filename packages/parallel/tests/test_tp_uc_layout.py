"""The universal-checkpoint record of tensor-parallel parameters, the model-level info gathered
from it, and per-sub-parameter cutting of fused weights."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ds.interfaces.tp_layout import (
    REPLICATED,
    ROW_PARALLEL,
    SHARD_WIDTHS,
    UNSUPPORTED,
    VOCABULARY,
    WITH_SUB_PARAMS,
)
from ds.parallel.tp import TPGroup, sub_params, uc_layout
from ds.parallel.tp.fused_qkv import fused_kind, fused_sub_param_sizes


def test_record_nests_the_conversion_view_and_stores_tuples() -> None:
    record = uc_layout.layout_record(
        partition_type="column",
        partition_dim=0,
        logical_shape=[12, 8],
        sub_param_shape=[3, -1],
        sub_param_sizes=[4, 4, 4],
        partition_sizes=[6, 6],
        original_shape=torch.Size([12, 8]),
    )
    assert record["logical_shape"] == (12, 8) and record["sub_param_sizes"] == (4, 4, 4)
    view = record["conversion"]
    assert view["sub_param_shape"] == (3, -1) and view["original_shape"] == (12, 8)
    assert "sub_param_sizes" not in view and "partition_sizes" not in view
    p = nn.Parameter(torch.zeros(1))
    uc_layout.mark(p, partition_type="row", partition_dim=1)
    assert uc_layout.conversion_view(p)["partition_type"] == "row"  # type: ignore[index]
    assert uc_layout.conversion_view(nn.Parameter(torch.zeros(1))) is None


def test_collect_classifies_parameters_by_their_records() -> None:
    model = nn.Module()
    model.embed_tokens = nn.Linear(4, 10, bias=False)
    model.proj = nn.Linear(4, 4)
    model.qkv = nn.Linear(4, 12)
    model.odd = nn.Linear(4, 4, bias=False)
    model.norm = nn.LayerNorm(4)
    model.lm_head = nn.Linear(4, 10, bias=False)
    model.lm_head.weight = model.embed_tokens.weight  # a tied alias
    uc_layout.mark(
        model.embed_tokens.weight,
        partition_type="column",
        partition_dim=0,
        original_shape=(10, 4),
    )
    uc_layout.mark(model.proj.weight, partition_type="row", partition_dim=1)
    uc_layout.mark(model.proj.bias, partition_type="row", is_bias=True, replicated=True)
    uc_layout.mark(
        model.qkv.weight,
        partition_type="column",
        partition_dim=0,
        sub_param_shape=(3, -1),
        sub_param_shard_widths=[[2, 2], [1, 3], [2, 2]],
    )
    uc_layout.mark(model.odd.weight, partition_type="column", unsupported_reason="interleaved")
    info = uc_layout.collect_universal_info(model)
    assert info[ROW_PARALLEL] == [r"^proj\.weight$"]
    assert r"^proj\.bias$" in info[REPLICATED] and r"^norm\.weight$" in info[REPLICATED]
    assert r"^qkv\.bias$" in info[REPLICATED]  # no record: left whole
    assert info[VOCABULARY] == [r"^embed_tokens\.weight$"] and info["original_vocab_size"] == 10
    # the physical sizes, not the count 3, stand at the partition dimension
    assert info[WITH_SUB_PARAMS] == [
        {"patterns": [r"^qkv\.weight$"], "shape": [(4, 4, 4), -1], "partition_dim": 0}
    ]
    assert info[SHARD_WIDTHS] == {r"^qkv\.weight$": [[2, 2], [1, 3], [2, 2]]}
    assert info[UNSUPPORTED] == {r"^odd\.weight$": "interleaved"}
    everything = str(info)
    assert "lm_head" not in everything


@pytest.mark.parametrize(
    ("shape", "dim", "want"),
    [
        ((3, -1), 0, ((12, 6), (12,), (4, 4, 4), 0)),
        (((6, 3, 3), -1), 0, ((12, 6), (12,), (6, 3, 3), 0)),
        ((4, -1, 6), 1, ((4, 3, 6), (4, 3), None, 1)),
        ((12, 2), 1, ((12, 6), (12,), (3, 3), None)),
    ],
)
def test_sub_param_shapes_resolve(shape: tuple, dim: int, want: tuple) -> None:
    assert sub_params.resolve_sub_param_shape((12, 6), shape, dim) == want


def test_sub_param_shape_that_does_not_view_the_weight_is_refused() -> None:
    with pytest.raises(ValueError, match="does not view"):
        sub_params.resolve_sub_param_shape((12, 6), (5, -1, 7), 0)


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_cut_and_join_round_trip_with_empty_pieces(tp: int) -> None:
    sizes = (8, 2, 2)
    widths = sub_params.shard_widths(sizes, tp)
    assert all(sum(w) == s for s, w in zip(sizes, widths))
    whole = torch.arange(12 * 3.0).view(12, 3)
    pieces = [sub_params.cut(whole, 0, sizes, widths, r) for r in range(tp)]
    assert sum(p.shape[0] for p in pieces) == 12
    assert torch.equal(sub_params.join(pieces, 0, widths), whole)


def test_shard_widths_must_tile_the_sub_parameter() -> None:
    with pytest.raises(AssertionError, match="do not split"):
        sub_params.shard_widths((6,), 2, lambda n: [n, 1])


def test_fused_qkv_packings() -> None:
    class CodeGenBlock(nn.Module):
        pass

    class FalconDecoderLayer(nn.Module):
        pass

    class GLMBlock(nn.Module):
        pass

    assert fused_kind(CodeGenBlock()) == "codegen" and fused_kind(nn.Linear(1, 1)) is None
    assert fused_kind(FalconDecoderLayer()) == "bloom"  # the longer name wins
    assert fused_sub_param_sizes("codegen", (12, 4)) is None
    assert fused_sub_param_sizes(fused_kind(GLMBlock()), (12, 4)) == (4, 4, 4)
    assert fused_sub_param_sizes("glm", (16, 8), num_kv_heads=2, n_embd=8) == (8, 4, 4)
    assert fused_sub_param_sizes("phi3", (16, 8), 2, None, 4) == (8, 4, 4)


def test_gather_pads_uneven_pieces_and_trims_them() -> None:
    sizes, tp = (5, 3), 2
    widths = sub_params.shard_widths(sizes, tp)  # [[3, 2], [2, 1]]: 5 rows on rank 0, 3 on 1
    whole = torch.arange(8 * 2.0).view(8, 2)
    pieces = [sub_params.cut(whole, 0, sizes, widths, r) for r in range(tp)]

    class Comm:
        # every rank sends its piece padded to the widest, as the all-gather receives them
        def all_gather(self, parts: list, t: torch.Tensor, group: object = None) -> None:
            for r, part in enumerate(parts):
                part.zero_()
                part[: pieces[r].shape[0]] = pieces[r]
                assert part.shape == t.shape

    gathered = sub_params.gather(pieces[1], 0, widths, TPGroup(Comm(), None, tp, 1))
    assert torch.equal(gathered, whole)
