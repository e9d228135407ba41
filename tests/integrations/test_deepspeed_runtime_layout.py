"""``deepspeed.runtime`` modules integrations and Megatron-DeepSpeed import, exercised: the
config views, the pipeline topology and schedule classes, the LR schedule constants, the
checkpoint constants, the MoE gate, the gradient helper and the refusals."""

from __future__ import annotations

import itertools

import pytest
import torch


def test_deepspeed_config_resolves_through_ds(monkeypatch: pytest.MonkeyPatch) -> None:
    import ds.full.compat.deepspeed as deepspeed
    from ds.full.compat.deepspeed.runtime.config import DeepSpeedConfig, DeepSpeedConfigError
    from ds.zero.config.sections import ZeroConfig

    assert deepspeed.DeepSpeedConfig is DeepSpeedConfig
    monkeypatch.setenv("WORLD_SIZE", "2")
    cfg = DeepSpeedConfig({
        "train_batch_size": 16, "train_micro_batch_size_per_gpu": 4,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "bf16": {"enabled": True}, "zero_optimization": {"stage": 2},
    })  # fmt: skip
    assert (cfg.train_batch_size, cfg.gradient_accumulation_steps, cfg.world_size) == (16, 2, 2)
    assert cfg.zero_optimization_stage == 2 and cfg.zero_enabled and cfg.bfloat16_enabled
    assert cfg.optimizer_name == "adamw" and cfg.optimizer_params == {"lr": 1e-3}
    assert isinstance(cfg.zero_config, ZeroConfig) and cfg.gradient_clipping == 1.0
    with pytest.raises(DeepSpeedConfigError, match="not divisible"):
        DeepSpeedConfig({"train_batch_size": 15, "train_micro_batch_size_per_gpu": 4})
    with pytest.raises(DeepSpeedConfigError, match="zero_optimization"):
        DeepSpeedConfig({"train_batch_size": 2, "zero_optimization": {"stage": 7}})
    assert cfg.expert_parallel_config.load_balance_coeff is None
    with pytest.raises(ValueError, match="load_balance_coeff"):
        DeepSpeedConfig({"train_batch_size": 2, "expert_parallel": {"load_balance_coeff": 0.01}})


def test_zero_precision_and_constants_are_views_of_ds_models() -> None:
    from ds.full.compat.deepspeed.runtime import config_utils, constants, precision_config
    from ds.full.compat.deepspeed.runtime.zero.config import DeepSpeedZeroConfig, ZeroStageEnum
    from ds.zero.config.model import DsConfig
    from ds.zero.config.sections import ZeroConfig

    assert issubclass(DeepSpeedZeroConfig, ZeroConfig)  # ds's model, as DeepSpeed shows it
    zero = DeepSpeedZeroConfig(stage=3, stage3_prefetch_bucket_size=10)
    assert zero.stage == ZeroStageEnum.weights and zero.prefetch_bucket_size == 10
    assert zero.overlap_comm is True and DeepSpeedZeroConfig(stage=2).overlap_comm is False
    assert ZeroConfig(stage=3).overlap_comm is None  # ds's own model leaves it to the engine
    old = DeepSpeedZeroConfig(cpu_offload=True, cpu_offload_param=True)
    assert old.offload_optimizer.device == "cpu" and old.offload_param.device == "cpu"
    nvme = DeepSpeedZeroConfig(offload_optimizer={"device": "nvme", "pipeline_read": True})
    assert nvme.offload_optimizer.pipeline and not old.offload_optimizer.pipeline
    assert config_utils.get_config_default(DeepSpeedZeroConfig, "sub_group_size") == 10**9
    fp16 = precision_config.get_float16_config({"fp16": {"enabled": True, "loss_scale": 0}})
    assert fp16.enabled and fp16.initial_scale_power == 16
    assert not precision_config.get_bfloat16_config({}).enabled
    assert constants.TRAIN_BATCH_SIZE == "train_batch_size"
    assert DsConfig.model_fields["gradient_clipping"].default == constants.GRADIENT_CLIPPING_DEFAULT
    assert (
        constants.STEPS_PER_PRINT_DEFAULT == 10
        and constants.ZERO_OPTIMIZATION == "zero_optimization"
    )
    assert config_utils.get_scalar_param({"a": 1}, "b", 2) == 2
    with pytest.raises(ValueError, match="duplicate keys"):
        config_utils.dict_raise_error_on_duplicate_keys([("a", 1), ("a", 2)])


def test_lr_schedule_constants_name_the_config_keys() -> None:
    from ds.full.compat.deepspeed.runtime import lr_schedules as lr

    assert lr.VALID_LR_SCHEDULES == ["LRRangeTest", "OneCycle", "WarmupLR", "WarmupDecayLR",
                                     "WarmupCosineLR"]  # fmt: skip
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    params = {lr.WARMUP_MIN_LR: 0.0, lr.WARMUP_MAX_LR: 0.1, lr.WARMUP_NUM_STEPS: 10,
              lr.WARMUP_TYPE: lr.WARMUP_LINEAR_RATE}  # fmt: skip
    sched = lr.WarmupLR(opt, **params)
    for _ in range(5):
        opt.step()
        sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05, rel=0.25)
    assert (
        lr.LR_RANGE_TEST_MIN_LR == "lr_range_test_min_lr"
        and lr.TOTAL_NUM_STEPS == "total_num_steps"
    )


def test_process_topologies_lay_ranks_out_row_major() -> None:
    from ds.full.compat.deepspeed.runtime.pipe.topology import (
        PipeModelDataParallelTopology,
        ProcessTopology,
        _prime_factors,
    )

    topo = PipeModelDataParallelTopology(num_pp=2, num_mp=2, num_dp=2)
    assert topo.get_axis_names() == ["pipe", "data", "model"] and topo.world_size() == 8
    assert topo.get_rank(pipe=1, data=0, model=1) == 5
    assert topo.get_coord(6) == topo.ProcessCoord(pipe=1, data=1, model=0)
    assert topo.get_axis_comm_lists("pipe") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert topo.get_axis_comm_lists("model") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert topo.filter_match(pipe=0, data=1) == [2, 3]
    assert topo.get_rank_repr(rank=3) == "model_01"
    assert topo.get_rank_repr(rank=3, omit_axes=[], inner_sep="+") == "pipe+00-data+01-model+01"
    assert topo.get_dim("tensor") == 0 and topo.get_axis_comm_lists("tensor") == []
    assert ProcessTopology(["a", "b"], [2, 3]).get_axis_list("b", 0) == [0, 3]
    assert _prime_factors(12) == [2, 2, 3]
    with pytest.raises(ValueError, match="not found"):
        topo.get_coord(8)
    with pytest.raises(ValueError, match="distinct"):
        ProcessTopology(["a", "a"], [1, 1])


def test_pipeline_schedules_emit_deepspeeds_instructions() -> None:
    from ds.full.compat.deepspeed.runtime.pipe import schedule as s

    first = list(s.TrainSchedule(micro_batches=4, stages=2, stage_id=0))
    last = list(s.TrainSchedule(micro_batches=4, stages=2, stage_id=1))
    for steps, send, recv in ((first, s.SendActivation, s.RecvGrad),
                              (last, s.SendGrad, s.RecvActivation)):  # fmt: skip
        flat = [c for step in steps for c in step]
        assert sum(isinstance(c, s.ForwardPass) for c in flat) == 4
        assert sum(isinstance(c, s.BackwardPass) for c in flat) == 4
        assert sum(isinstance(c, send) for c in flat) == 4
        assert sum(isinstance(c, recv) for c in flat) == 4
        assert steps[-1][-3:] == [s.ReduceTiedGrads(), s.ReduceGrads(), s.OptimizerStep()]
    # A clock of 2 * (micro_batches + stages - 1) steps; a result is sent the step after.
    assert len(first) == len(last) == 2 * (4 + 2 - 1)
    assert first[0] == [s.LoadMicroBatch(0), s.ForwardPass(0)]
    assert first[1][0] == s.SendActivation(0) and last[0] == []
    assert [type(c) for c in last[1]] == [s.RecvActivation, s.LoadMicroBatch, s.ForwardPass]
    assert s.ForwardPass(1).buffer_id == 1 and repr(s.ForwardPass(1)) == "ForwardPass(buffer_id=1)"
    infer = list(s.InferenceSchedule(micro_batches=2, stages=2, stage_id=0))
    assert infer == [
        [s.LoadMicroBatch(0), s.ForwardPass(0)],
        [s.LoadMicroBatch(1), s.SendActivation(0), s.ForwardPass(1)],
        [s.SendActivation(1)],
    ]
    with pytest.raises(ValueError, match="stage_id"):
        s.TrainSchedule(micro_batches=2, stages=2, stage_id=2)


def test_checkpoint_moe_and_gradient_helpers() -> None:
    from ds.full.compat.deepspeed.checkpoint import (
        OPTIMIZER_STATE_DICT,
        UNIVERSAL_CHECKPOINT_INFO,
        ds_to_universal,
    )
    from ds.full.compat.deepspeed.moe import sharded_moe
    from ds.full.compat.deepspeed.runtime.activation_checkpointing import checkpointing
    from ds.full.compat.deepspeed.utils import safe_get_full_grad
    from ds.parallel.moe.gate import TopKGate
    from ds.zero import checkpointing as ds_checkpointing

    assert (UNIVERSAL_CHECKPOINT_INFO, OPTIMIZER_STATE_DICT) == (
        "universal_checkpoint_info", "optimizer_state_dict",
    )  # fmt: skip
    args = ds_to_universal.parse_arguments(["--input_folder", "a", "--output_folder", "b"])
    assert (args.input_folder, args.strict, args.inject_missing_state) == ("a", True, False)
    gate = sharded_moe.TopKGate(8, 4, k=1)
    assert isinstance(gate, TopKGate)
    _, combine, _, counts = gate(torch.randn(16, 8))[:4]
    assert combine.shape[:2] == (16, 4) and int(counts.sum()) <= 16
    assert checkpointing.checkpoint is ds_checkpointing.checkpoint
    p = torch.nn.Parameter(torch.ones(3))
    assert safe_get_full_grad(p) is None
    torch.nn.functional.linear(torch.ones(1, 3), p[None]).sum().backward()
    assert torch.equal(safe_get_full_grad(p), torch.ones(3))


def test_partition_helpers_and_expert_rank_layout() -> None:
    from ds.full.compat.deepspeed.runtime import utils
    from ds.full.compat.deepspeed.utils.groups import _get_expert_parallel_ranks

    def spread(weights: list[int], parts: int) -> int:
        bounds = utils.partition_balanced(weights, parts)
        assert bounds[0] == 0 and bounds[-1] == len(weights) and len(bounds) == parts + 1
        sums = [sum(weights[b:e]) for b, e in itertools.pairwise(bounds)]
        return max(sums) - min(sums)

    assert [spread([1, 2, 1], 4), spread([1, 1, 1, 1], 4), spread([1, 1, 1, 1, 1], 4)] == [2, 0, 1]
    assert spread([1, 1, 1, 1, 0, 1], 4) == 1 and spread([5, 1, 1, 1, 1, 5], 3) == 1
    assert utils.partition_uniform(10, 3) == [0, 4, 7, 10]
    assert utils.call_to_str("f", 1, x=2) == "f(1, x=2)"
    ep, edp = _get_expert_parallel_ranks(16, tensor_parallel_size_=2, expert_parallel_size_=4)
    assert ep == [[0, 2, 4, 6], [8, 10, 12, 14], [1, 3, 5, 7], [9, 11, 13, 15]]
    assert edp[:4] == [[0, 8], [2, 10], [4, 12], [6, 14]] and len(edp) == 8
    with pytest.raises(ValueError, match="multiple of expert parallel size"):
        _get_expert_parallel_ranks(16, tensor_parallel_size_=2, expert_parallel_size_=3)


def test_config_models_move_deprecated_fields() -> None:
    from pydantic import Field

    from ds.full.compat.deepspeed.runtime.config_utils import DeepSpeedConfigModel

    class Conf(DeepSpeedConfigModel):
        old: str | None = Field(
            None,
            json_schema_extra={
                "deprecated": True,
                "new_param": "new",
                "new_param_fn": lambda x: [x],
            },
        )
        new: list[str] | None = None

    assert Conf(old="a").new == ["a"] and Conf(new=["b"]).new == ["b"]
    with pytest.raises(AssertionError, match="both given"):
        Conf(old="a", new=["b"])
