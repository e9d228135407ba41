"""Universal checkpoints: the rank maps of a shrinking 3D layout, merging tensor-parallel slices
(even, uneven, fused) and cutting them back, and converting a hand-written ZeRO-3 tag."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from ds.checkpoint.deepspeed_3d import CheckpointLayout, read_degrees
from ds.checkpoint.rank_layout import ParallelDegrees
from ds.checkpoint.universal_autoep import aggregate_zero12_metadata
from ds.checkpoint.universal_main import convert_zero3
from ds.checkpoint.universal_slice import autotp_rank_slice, layout_rank_slice, load_entry
from ds.checkpoint.universal_tp import (
    SHARD_WIDTHS,
    VERSION,
    VERSION_KEY,
    WITH_SUB_PARAMS,
    check_conversion_supported,
    merge_tp_param,
)


def test_shrinking_a_3d_layout_merges_neighbouring_files() -> None:
    src = ParallelDegrees(pp_degree=2, tp_degree=2, dp_degree=2)
    maps = src.reshape(ParallelDegrees(1, 2, 2))
    assert [m.get_data(0, tp) for m in maps for tp in range(2)] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert src.reshape(ParallelDegrees(1, 1, 1))[0].get_data(0, 0) == [0, 4, 1, 5, 2, 6, 3, 7]
    ok, errors = src.can_reshape(ParallelDegrees(4, 1, 1))
    assert not ok and "PP: 2 ---> 4" in errors[0]


def _layout_tag(tmp: Path, dims: list[dict[str, int] | None]) -> None:
    for mp, d in enumerate(dims):
        state = {"param_shapes": [{"w": (2,)}], "ds_config": {}, "universal_checkpoint_info": {}}
        if d is not None:
            state["checkpoint_parallel_dimensions"] = d
        torch.save(state, tmp / f"mp_rank_{mp:02d}_model_states.pt")
        for dp in range(3):
            torch.save({}, tmp / f"zero_pp_rank_{dp}_mp_rank_{mp:02d}_optim_states.pt")


def test_recorded_degrees_win_over_file_counts(tmp_path: Path) -> None:
    _layout_tag(tmp_path, [{"pp_degree": 2, "tp_degree": 1}] * 2)
    layout = CheckpointLayout(str(tmp_path))
    assert (layout.pp_degree, layout.tp_degree, layout.dp_degree) == (2, 1, 3)
    assert len(layout.get_zero_files(1, 0, 2)) == 1
    (tmp_path / "mp_rank_01_model_states.pt").unlink()
    _layout_tag(tmp_path, [{"pp_degree": 2, "tp_degree": 1}, None])
    with pytest.raises(RuntimeError, match="missing from model-state files"):
        read_degrees(str(tmp_path))


def test_fused_uneven_slices_merge_and_cut_back() -> None:
    # 6 query and 3+3 key/value rows over 2 ranks: rank 0 holds 4+2+2, rank 1 holds 2+1+1
    full = torch.arange(24.0).view(12, 2)
    widths = [[4, 2], [2, 1], [2, 1]]
    rows = [[0, 1, 2, 3, 6, 7, 9, 10], [4, 5, 8, 11]]
    info = {
        VERSION_KEY: VERSION,
        WITH_SUB_PARAMS: [{"patterns": ["^qkv$"], "shape": [(6, 3, 3), 2], "partition_dim": 0}],
        SHARD_WIDTHS: {"^qkv$": widths},
    }
    used: set[str] = set()
    entry = merge_tp_param(info, "qkv", [full[r] for r in rows], used)
    assert entry is not None and torch.equal(entry["param"], full) and used == {"^qkv$"}
    meta = {
        VERSION_KEY: VERSION,
        "partition_dim": 0,
        "logical_shape": (12, 2),
        "sub_param_sizes": (6, 3, 3),
        "sub_param_shard_widths": widths,
    }
    for rank in range(2):
        piece = autotp_rank_slice(meta, full, rank, 2)
        assert piece is not None and torch.equal(piece, full[rows[rank]].flatten())


def test_row_parallel_and_even_slices() -> None:
    full = torch.arange(16.0).view(4, 4)
    entry = merge_tp_param(
        {"parameter_with_row_parallelism_patterns": ["^w$"]}, "w", list(full.chunk(2, 1)), set()
    )
    assert entry is not None and entry["cat_dim"] == 1 and torch.equal(entry["param"], full)
    assert torch.equal(layout_rank_slice(entry, full, 8, 1, 2), full[:, 2:].flatten())
    with pytest.raises(AssertionError, match="records no partition_sizes"):
        autotp_rank_slice({"partition_dim": 0, "logical_shape": (10, 2)}, torch.zeros(10, 2), 0, 4)


def test_conversion_refuses_layouts_the_writer_marked_unsupported() -> None:
    with pytest.raises(ValueError, match="interleaved"):
        check_conversion_supported(
            {"autotp_unsupported_parameter_patterns": {"^qkv$": "interleaved"}}
        )


def test_zero3_tag_with_two_tensor_ranks_converts(tmp_path: Path) -> None:
    full = torch.arange(20.0).view(5, 4)
    shards = [full[:3], full[3:]]  # uneven column-parallel split
    tag = tmp_path / "step2"
    tag.mkdir()
    info = {VERSION_KEY: VERSION}
    for tp, shard in enumerate(shards):
        flat = shard.reshape(-1)
        per = (flat.numel() + 1) // 2
        for dp in range(2):
            part = torch.zeros(per)
            piece = flat[dp * per : (dp + 1) * per]
            part[: piece.numel()] = piece
            optim = {
                "optimizer_state_dict": {
                    "state": [{"exp_avg": part * 2, "exp_avg_sq": part * 3}],
                    "param_groups": [{"lr": 1.0}],
                },
                "fp32_flat_groups": [part],
                "zero_stage": 3,
            }
            stem = tag / f"zero_pp_rank_{dp}_mp_rank_{tp:02d}"
            torch.save(
                {"param_shapes": [{"fc": list(shard.shape)}], "universal_checkpoint_info": info},
                f"{stem}_model_states.pt",
            )
            torch.save({"optimizer_state_dict": optim}, f"{stem}_optim_states.pt")
    names = sorted(os.listdir(tag))
    out = tmp_path / "step2_universal"
    convert_zero3(
        [str(tag / n) for n in names if n.endswith("model_states.pt")],
        [str(tag / n) for n in names if n.endswith("optim_states.pt")],
        str(out),
    )
    for state, scale in (("fp32", 1), ("exp_avg", 2), ("exp_avg_sq", 3)):
        entry = load_entry(str(out / "zero" / "fc" / f"{state}.pt"))
        assert entry["cat_dim"] == 0 and torch.equal(entry["param"], full * scale)
    assert (tmp_path / "latest_universal").read_text() == "step2_universal"
    assert not (out / "tmp").exists()


def test_autoep_metadata_must_agree_across_files() -> None:
    layer = {"expert_key_prefix": "m.experts", "num_experts": 4}
    meta = {"param_shapes": {}, "ds_autoep_layers": [layer], "ds_config": {}}
    _, layers, data_first = aggregate_zero12_metadata([("a", meta), ("b", meta)])
    assert layers == [layer] and data_first is False
    other = dict(meta, ds_autoep_layers=[dict(layer, num_experts=8)])
    with pytest.raises(RuntimeError, match="Conflicting AutoEP metadata"):
        aggregate_zero12_metadata([("a", meta), ("b", other)])


def test_expert_files_stack_in_global_order_and_folding_is_checked(tmp_path: Path) -> None:
    from ds.checkpoint.autoep_files import (
        consolidate_expert_files,
        make_folding_metadata,
        validate_folding_metadata,
    )

    for e in range(3):
        sd = {f"m.experts.{w}.{e}": torch.full((2, 2), float(e)) for w in ("w1", "w2", "w3")}
        torch.save(sd, tmp_path / f"layer_0_expert_{e}_mp_rank_00_model_states.pt")
    layers = [{"moe_layer_id": 0, "num_experts": 3, "expert_key_prefix": "m.experts"}]
    consolidate_expert_files(str(tmp_path), str(tmp_path / "out"), layers)
    entry = load_entry(str(tmp_path / "out" / "zero" / "m.experts.w2" / "fp32.pt"))
    assert entry["ep_num_experts"] == 3 and entry["param"][:, 0, 0].tolist() == [0.0, 1.0, 2.0]
    folding = make_folding_metadata(
        tp_size=2, tp_rank=0, ep_size=2, ep_rank=1, zero_partition_group="edp",
        zero_partition_rank=0, zero_partition_count=2, family="routed_expert",
    )  # fmt: skip
    assert validate_folding_metadata(
        {"folding": folding}, tp_size=2, ep_size=2, family="routed_expert"
    )
    with pytest.raises(RuntimeError, match="zero_partition_count"):
        validate_folding_metadata(
            {"folding": folding}, tp_size=2, ep_size=2, zero_partition_count=4
        )


def test_a_fused_entry_written_by_the_converter_reads_back_weights_only(tmp_path: Path) -> None:
    from ds.checkpoint.deepspeed_layout import load_file
    from ds.checkpoint.universal_tp import SubparamShape

    shape = SubparamShape(["^qkv$"], ((2, 2), 3), 0)
    torch.save({"param": torch.zeros(4, 3), "sub_param_shape": shape}, tmp_path / "fp32.pt")
    assert load_file(str(tmp_path / "fp32.pt"))["sub_param_shape"] == shape


def test_zero2_autoep_experts_are_stacked_over_expert_ranks(tmp_path: Path) -> None:
    # two ranks, expert-parallel 2: each holds one of the two experts whole and half the dense
    # weight; the universal entry stacks the experts in expert-rank order
    from ds.checkpoint.universal_main import convert

    tag = tmp_path / "step1"
    tag.mkdir()
    layer = {"moe_layer_id": 0, "module_path": "m", "expert_key_prefix": "m.experts"}
    layer.update(num_experts=2, num_local_experts=1, ep_size=2)
    names = [f"m.experts.w{i}" for i in (1, 2, 3)]
    shapes = [{"dense": (2,)}, {n: (1, 2) for n in names}]
    model = {
        "param_shapes": shapes,
        "ds_autoep_layers": [layer],
        "ds_config": {},
        "universal_checkpoint_info": {},
    }
    torch.save(model, tag / "mp_rank_00_model_states.pt")
    experts = torch.arange(12.0).view(2, 6)  # per expert: w1, w2, w3 of two elements each
    slices = [
        {"dense": {"start": 0, "numel": 1}},
        {n: {"start": 2 * i, "numel": 2} for i, n in enumerate(names)},
    ]
    for dp in range(2):
        flat = [torch.tensor([5.0 + dp]), experts[dp].clone()]
        state = {
            g: {"exp_avg": t * 2, "exp_avg_sq": t * 3, "step": torch.tensor(4.0)}
            for g, t in enumerate(flat)
        }
        optim = {
            "base_optimizer_state": {"state": state, "param_groups": [{"lr": 1.0}, {"lr": 1.0}]},
            "single_partition_of_fp32_groups": flat,
            "param_slice_mappings": slices,
            "zero_stage": 2,
        }
        torch.save(
            {"optimizer_state_dict": optim}, tag / f"zero_pp_rank_{dp}_mp_rank_00_optim_states.pt"
        )
    out = tmp_path / "step1_universal"
    convert(str(tag), str(out))
    expert = load_entry(str(out / "zero" / "m.experts.w2" / "exp_avg.pt"))
    assert expert["is_expert_param"] and expert["ep_num_experts"] == 2
    assert torch.equal(expert["param"], experts[:, 2:4] * 2)
    assert torch.equal(
        load_entry(str(out / "zero" / "dense" / "fp32.pt"))["param"], torch.tensor([5.0, 6.0])
    )
    info = torch.load(out / "mp_rank_00_model_states.pt", weights_only=True)[
        "universal_checkpoint_info"
    ]
    assert info["ds_autoep_layers"][0]["expert_key_prefix"] == "m.experts"
