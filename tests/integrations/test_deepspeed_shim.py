"""The ``deepspeed`` migration shim: a DeepSpeed-style script runs unchanged on ds (2 ranks,
ZeRO-3 with zero.Init, GatheredParameters, checkpoints), and the shim never hides a real DeepSpeed
without being asked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).with_name("deepspeed_style")
DS = Path(sys.executable).with_name("ds")


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_deepspeed_script_runs_unchanged(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    cmd = [
        str(DS), "run", "--nproc", "2",
        str(HERE / "run_with_shim.py"), str(HERE / "train.py"),
        "--deepspeed", "--deepspeed_config", str(HERE / "ds_config.json"),
        "--out", str(out), "--ckpt", str(tmp_path / "ckpt"),
    ]  # fmt: skip
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    got = json.loads(out.read_text())
    assert got["world_size"] == 2 and got["stage"] == 3
    # 64 samples / (8 per rank x 2 ranks) = 4 steps per epoch, 3 epochs.
    assert got["global_steps"] == 12 and len(got["losses"]) == 12
    assert sum(got["losses"][-4:]) < sum(got["losses"][:4])
    # GatheredParameters made the ZeRO-3 partitioned parameters whole.
    assert got["shapes"] == [[24, 12], [24], [1, 24], [1]]
    assert got["client"] == {"epoch": 3}
    assert got["local_rank"] == 0 and got["global_rank"] == 0 and got["dp_world_size"] == 2
    assert got["device"] == "cpu" and got["was_step_applied"] is True
    assert got["mom"] == [[0.9, 0.999]] and got["steps_per_print"] == 100


def test_names_map_onto_ds() -> None:
    import ds.comm
    import ds.full
    import ds.full.compat.deepspeed as deepspeed
    import ds.zero
    from ds.zero import activation_checkpointing
    from ds.zero.engine import ZeroEngine

    # DeepSpeed's argument rules first (see test_deepspeed_routes), then ds.full.initialize
    assert deepspeed._ds_initialize is ds.full.initialize
    assert deepspeed.init_distributed is ds.full.init_distributed
    assert deepspeed.DeepSpeedEngine is ZeroEngine
    assert issubclass(deepspeed.zero.Init, ds.zero.Init)  # with DeepSpeed's argument order
    assert deepspeed.zero.GatheredParameters is ds.zero.GatheredParameters
    assert deepspeed.comm.all_reduce is ds.comm.all_reduce
    assert deepspeed.checkpointing.checkpoint is activation_checkpointing.checkpoint
    with pytest.raises(AttributeError, match="no ds equivalent"):
        _ = deepspeed.DeepSpeedHybridEngine
    from ds.full.pipeline import PipelineEngine

    assert deepspeed.PipelineEngine is PipelineEngine and issubclass(PipelineEngine, ZeroEngine)


def test_install_refuses_to_hide_real_deepspeed_unless_asked() -> None:
    code = (
        "import importlib.util, sys, ds.full.compat as c\n"
        "real = importlib.util.find_spec('deepspeed') is not None\n"
        "try:\n    c.install()\n    print('installed', real)\n"
        "except Exception as e:\n    print('refused', real, type(e).__name__)\n"
        "c.install(shadow=True)\nimport deepspeed\nprint(deepspeed.__name__)\n"
        "c.uninstall()\nprint('deepspeed' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.split()
    real = lines[1] == "True"
    # With DeepSpeed installed, a plain install() refuses; without it, install() just works.
    assert lines[0] == ("refused" if real else "installed")
    if real:
        assert lines[2] == "ConfigError"
    assert "ds.full.compat.deepspeed" in lines
    assert lines[-1] == "False"


# What scripts and the transformers/accelerate DeepSpeed integrations import (module, names).
IMPORTED = [
    ("deepspeed", ["initialize", "DeepSpeedEngine", "comm", "zero", "init_inference"]),
    ("deepspeed.zero", ["Init", "GatheredParameters"]),
    ("deepspeed.ops.adam", ["DeepSpeedCPUAdam", "FusedAdam"]),
    ("deepspeed.ops.adagrad", ["DeepSpeedCPUAdagrad"]),
    ("deepspeed.ops.lion", ["DeepSpeedCPULion"]),
    ("deepspeed.runtime.lr_schedules", ["VALID_LR_SCHEDULES", "WarmupLR", "WarmupDecayLR"]),
    ("deepspeed.runtime.utils", ["move_to_device"]),
    ("deepspeed.runtime.engine", ["DeepSpeedEngine"]),
    ("deepspeed.launcher.runner", ["DEEPSPEED_ENVIRONMENT_NAME"]),
    ("deepspeed.checkpoint.utils", ["clone_tensors_for_torch_save"]),
    ("deepspeed.utils", ["logger", "log_dist", "set_z3_leaf_modules", "safe_get_full_fp32_param"]),
    ("deepspeed.utils.zero_to_fp32", ["get_fp32_state_dict_from_zero_checkpoint"]),
    ("deepspeed.utils.groups", ["_get_data_parallel_world_size"]),
    ("deepspeed.moe.utils", ["split_params_into_different_moe_groups_for_optimizer"]),
    ("deepspeed.moe.layer", ["MoE"]),
    ("deepspeed.pipe", ["PipelineModule", "LayerSpec"]),
    ("deepspeed.profiling.flops_profiler", ["FlopsProfiler", "get_model_profile"]),
    ("deepspeed.accelerator", ["get_accelerator"]),
]


@pytest.mark.parametrize(("module", "names"), IMPORTED)
def test_integration_imports_resolve(module: str, names: list[str]) -> None:
    import importlib

    mod = importlib.import_module(module.replace("deepspeed", "ds.full.compat.deepspeed", 1))
    for name in names:
        assert getattr(mod, name) is not None, f"{module}.{name}"


def test_names_whose_feature_ds_lacks_raise_naming_it_when_used() -> None:
    import torch

    import ds.full.compat.deepspeed as deepspeed
    from ds.full.compat.deepspeed._missing import FeatureNotAvailableError
    from ds.full.compat.deepspeed.moe.utils import (
        split_params_into_different_moe_groups_for_optimizer as split,
    )
    from ds.full.compat.deepspeed.ops.op_builder import InferenceBuilder

    for call, feature in [
        (lambda: deepspeed.init_inference(None), "DeepSpeed-Inference"),
        (lambda: InferenceBuilder().load(), "DeepSpeed-Inference"),
    ]:
        with pytest.raises(FeatureNotAvailableError, match=feature):
            call()
    # a dense model's parameter groups pass through the MoE helper unchanged (DeepSpeed's result)
    p = torch.nn.Parameter(torch.zeros(2))
    assert split({"params": [p], "name": "parameters"}) == [{"params": [p], "name": "parameters"}]


def test_pipe_names_are_ds_pipeline_classes() -> None:
    import ds.parallel.pipeline as pipeline
    from ds.full.compat.deepspeed import pipe

    assert pipe.PipelineModule is pipeline.PipelineModule
    assert pipe.LayerSpec is pipeline.LayerSpec and pipe.TiedLayerSpec is pipeline.TiedLayerSpec


def test_helpers_behave_as_deepspeeds() -> None:
    import torch

    from ds.full.compat.deepspeed.checkpoint.utils import clone_tensors_for_torch_save
    from ds.full.compat.deepspeed.ops.adam import FusedAdam
    from ds.full.compat.deepspeed.runtime.lr_schedules import VALID_LR_SCHEDULES, WarmupLR
    from ds.full.compat.deepspeed.runtime.utils import move_to_device

    base = torch.arange(6.0)
    cloned = clone_tensors_for_torch_save({"a": [base[:2]], "b": (base[2:],)})
    assert cloned["a"][0].untyped_storage().nbytes() == 8  # its own storage, not the base's
    assert type(cloned["b"]) is tuple
    moved = move_to_device({"x": [base], "n": 3}, "cpu")
    assert moved["n"] == 3 and torch.equal(moved["x"][0], base)
    assert "WarmupLR" in VALID_LR_SCHEDULES and WarmupLR.__name__ == "WarmupLR"
    # FusedAdam: DeepSpeed's signature; adam_w_mode=True is AdamW (decoupled decay)
    w1, w2 = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    ours = FusedAdam([w1], lr=0.1, weight_decay=0.5)
    ref = torch.optim.AdamW([w2], lr=0.1, weight_decay=0.5)
    w3, w4 = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    l2 = FusedAdam([w3], lr=0.1, weight_decay=0.5, adam_w_mode=False)  # L2 decay: torch's Adam
    ref_l2 = torch.optim.Adam([w4], lr=0.1, weight_decay=0.5)
    assert ours.adam_w_mode is True and l2.adam_w_mode is False
    for opt, w in ((ours, w1), (ref, w2), (l2, w3), (ref_l2, w4)):
        w.grad = torch.full((3,), 0.3)
        opt.step()
    torch.testing.assert_close(w1, w2)
    torch.testing.assert_close(w3, w4)


def test_moe_names_are_ds_moe() -> None:
    import torch

    from ds.full.compat.deepspeed.moe.layer import MoE
    from ds.full.compat.deepspeed.moe.utils import is_moe_param
    from ds.parallel.moe import MoE as DsMoE

    layer = MoE(hidden_size=8, expert=torch.nn.Linear(8, 8), num_experts=2, k=1)
    assert isinstance(layer, DsMoE)
    out, l_aux, counts = layer(torch.randn(2, 4, 8))
    assert out.shape == (2, 4, 8) and l_aux.dim() == 0 and int(counts.sum()) == 8
    assert all(is_moe_param(p) for p in layer.deepspeed_moe.experts.parameters())
