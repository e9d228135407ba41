"""``write_deepspeed``: DeepSpeed's flat ZeRO 1/2 partitions (padding to 2 * world, equal slices),
its per-rank bookkeeping, and one-line refusals of what it cannot write."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ds.checkpoint.cli import main as checkpoint_cli
from ds.checkpoint.deepspeed_format import DeepSpeedCheckpoint
from ds.checkpoint.deepspeed_layout import load_file
from ds.checkpoint.deepspeed_writer import write_deepspeed
from ds.checkpoint.engine import ShardedCheckpointEngine
from ds.checkpoint.sharding import shard_state
from ds.interfaces.errors import CheckpointError

SHAPES = {"a": (5, 3), "b": (4,), "c": (7,)}  # 26 elements: padded to 30 at world 3
ORDER = ["a", "b", "c"]


def _tag(
    root: Path, dtype: torch.dtype = torch.bfloat16, frozen: bool = False, **objects: object
) -> Path:
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for n, shape in SHAPES.items():
        master = torch.randn(shape, generator=g)
        tensors[f"module.{n}"] = master.to(dtype)
        if dtype != torch.float32:
            tensors[f"master.{n}"] = master
        tensors[f"optim.exp_avg.{n}"] = torch.randn(shape, generator=g)
        tensors[f"optim.exp_avg_sq.{n}"] = torch.rand(shape, generator=g)
    if frozen:
        tensors["frozen.f"] = torch.ones(3, dtype=dtype)
    state = shard_state(tensors, 0, 1)
    state.objects = {
        "zero_stage": 2,
        "global_steps": 4,
        "step": 4,
        "lr_scheduler": {"last_batch_iteration": 3},
        "client_state": {"epoch": 1},
        "ds_config": {"gradient_clipping": 1.0, "bf16": {"enabled": dtype == torch.bfloat16}},
        "optimizer.param_groups": [
            {
                "lr": 0.01,
                "betas": (0.9, 0.999),
                "eps": 1e-8,
                "weight_decay": 0.0,
                "adamw_mode": True,
            }
        ],
        "optimizer.scalar_state": [{"step": 4}],
        "optimizer.group_origin": [0],
        "optimizer.group_params": [ORDER],
        **objects,
    }
    ShardedCheckpointEngine().save(str(root), "global_step4", state)
    return root


def _flat(root: Path, key: str) -> torch.Tensor:
    eng = ShardedCheckpointEngine()
    out = []
    for n in ORDER:
        t = eng.load(str(root), None, [_req(f"{key}.{n}", SHAPES[n])]).tensors[f"{key}.{n}"]
        out.append(t.local.float().reshape(-1))
    return torch.cat(out + [torch.zeros(4)])


def _req(name: str, shape: tuple[int, ...]):  # type: ignore[no-untyped-def]
    from ds.interfaces.checkpoint import LoadRequest

    return LoadRequest(name, 0, int(torch.Size(shape).numel()))


def test_partitions_follow_deepspeed_padding_and_slices(tmp_path: Path) -> None:
    src = _tag(tmp_path / "ds")
    path = Path(write_deepspeed(str(src), str(tmp_path / "out"), world_size=3))
    masters, moments = _flat(src, "master"), _flat(src, "optim.exp_avg")
    mapped = {}
    for r in range(3):
        sd = load_file(str(path / f"bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt"))
        osd = sd["optimizer_state_dict"]
        lo, hi, pad = r * 10, (r + 1) * 10, 4 if r == 2 else 0
        assert osd["group_paddings"] == [pad] and osd["partition_count"] == [3]
        assert int(osd["zero_stage"]) == 2
        assert torch.equal(osd["single_partition_of_fp32_groups"][0], masters[lo : hi - pad])
        state = osd["base_optimizer_state"]["state"][0]
        assert torch.equal(state["exp_avg"], moments[lo:hi])  # padded: the torch state's size
        assert float(state["step"]) == 4.0
        group = osd["base_optimizer_state"]["param_groups"][0]
        assert group["params"] == [0] and group["decoupled_weight_decay"] is True
        for name, addr in osd["param_slice_mappings"][0].items():
            mapped.setdefault(name, 0)
            mapped[name] += addr.numel
            assert addr.start >= 0 and addr.start + addr.numel <= hi - lo - pad
    assert mapped == {n: torch.Size(s).numel() for n, s in SHAPES.items()}
    ms = load_file(str(path / "mp_rank_00_model_states.pt"))
    assert [list(g) for g in ms["param_shapes"]] == [ORDER]
    assert ms["dp_world_size"] == 3 and ms["global_steps"] == 4 and ms["epoch"] == 1
    assert (tmp_path / "out" / "latest").read_text() == "global_step4"
    # A second conversion at another size leaves no partition of the first behind.
    write_deepspeed(str(src), str(tmp_path / "out"), world_size=1, zero_stage=1, dtype="fp32")
    assert sorted(p.name for p in path.iterdir()) == [
        "mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"]  # fmt: skip
    ck = DeepSpeedCheckpoint(str(tmp_path / "out"))
    assert ck.stage == 1 and ck.model_dtype == torch.float32
    got = ck.tensors["module.a"].read(0, 15)
    assert torch.equal(got, masters[:15])  # fp32 weights are the masters


def test_order_comes_from_the_caller_when_the_tag_has_none(tmp_path: Path) -> None:
    src = _tag(tmp_path / "ds", **{"optimizer.group_params": None})
    with pytest.raises(CheckpointError, match="records no parameter order"):
        write_deepspeed(str(src), str(tmp_path / "o1"))
    path = Path(write_deepspeed(str(src), str(tmp_path / "o2"), param_groups=[["c", "a", "b"]]))
    ms = load_file(str(path / "mp_rank_00_model_states.pt"))
    assert list(ms["param_shapes"][0]) == ["c", "a", "b"]
    with pytest.raises(CheckpointError, match="missing: \\['c'\\]"):
        write_deepspeed(str(src), str(tmp_path / "o3"), param_groups=[["a", "b"]])


@pytest.mark.parametrize(
    ("objects", "kwargs", "message"),
    [
        ({}, {"zero_stage": 3}, "ZeRO stage 3 is not written"),
        ({}, {"zero_stage": 4}, "ZeRO stage 4 is not written"),
        ({}, {"dtype": "fp16"}, "dtype 'fp16' is not written"),
        ({"tensor_parallel_size": 2}, {}, "tensor parallelism"),
        ({"optimizer.group_origin": [0, 0]}, {}, "split the optimizer groups"),
        ({"ds_autoep_layers": {"x": 1}}, {}, "mixture-of-experts"),
    ],
)
def test_refusals_name_what_is_not_written(
    tmp_path: Path, objects: dict, kwargs: dict, message: str
) -> None:
    src = _tag(tmp_path / "ds", **objects)
    with pytest.raises(CheckpointError, match=message):
        write_deepspeed(str(src), str(tmp_path / "out"), **kwargs)


def test_stage0_keeps_the_optimizer_whole_in_the_model_states(tmp_path: Path) -> None:
    src = _tag(tmp_path / "ds")
    path = Path(write_deepspeed(str(src), str(tmp_path / "out"), zero_stage=0, world_size=2))
    assert [p.name for p in path.iterdir()] == ["mp_rank_00_model_states.pt"]
    opt = load_file(str(path / "mp_rank_00_model_states.pt"))["optimizer"]
    torch_sd = opt["optimizer_state_dict"]  # bf16: DeepSpeed's wrapper with the fp32 masters
    assert torch_sd["param_groups"][0]["params"] == [0, 1, 2]
    masters = _flat(src, "master")
    assert torch.equal(torch.cat([t.reshape(-1) for t in opt["fp32_groups"][0]]), masters[:26])
    ck = DeepSpeedCheckpoint(str(tmp_path / "out"))
    assert ck.stage == 0
    assert torch.equal(ck.tensors["optim.exp_avg.b"].read(0, 4), _flat(src, "optim.exp_avg")[15:19])
    with pytest.raises(CheckpointError, match="stage 0 with frozen parameters"):
        write_deepspeed(str(_tag(tmp_path / "f", frozen=True)), str(tmp_path / "o"), zero_stage=0)


def test_fp16_tags_and_cli_errors_are_one_line(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    src = _tag(tmp_path / "ds", dtype=torch.float16)
    argv = ["export", "--format", "deepspeed", str(src), str(tmp_path / "out")]
    assert checkpoint_cli(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "float16" in err and "ZeRO stage 0-2" in err
    assert checkpoint_cli(["export", "--format", "deepspeed", str(src)]) == 2
