"""Stage 3 at gloo world 2: activation checkpointing, the no-hang guarantee, memory bounds by the
partitioner's own accounting, and checkpoints resharded to world 1 and 3 and into stage 2."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

_spec = importlib.util.spec_from_file_location(
    "stage3_launch", Path(__file__).with_name("stage3_launch.py")
)
assert _spec is not None and _spec.loader is not None
launch = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(launch)

BASE: dict[str, Any] = {
    "steps": 12,
    "global_batch": 6,  # divisible by 1, 2 and 3: the same global batch at every world size
    "zero": {"stage3_param_persistence_threshold": 64},
}
AC = {
    "partition_activations": True,
    "cpu_checkpointing": True,
    "contiguous_memory_optimization": True,
    "number_checkpoints": 2,
}
# The memory model: 8 blocks; each rank's parameter budget is a quarter of the model.
MEM_MODEL = {"vocab": 128, "d": 48, "layers": 8, "heads": 2}
MEM_LIMITS = {
    "stage3_param_persistence_threshold": 100,
    "stage3_max_live_parameters": 20_000,
    "stage3_prefetch_bucket_size": 10_000,
    "stage3_max_reuse_distance": 0,
}


pytestmark = pytest.mark.multiprocess


def _on_world2(test: Any) -> Any:
    """A check of the shared world-of-two run (slow: the run takes minutes)."""
    return pytest.mark.slow(pytest.mark.timeout(360)(test))


@pytest.fixture(scope="module")
def world2(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], Path]:
    out = tmp_path_factory.mktemp("stage3-world2")
    save_dir = out / "ckpt"
    cases = [
        {**BASE, "name": "plain", "save_at": 7, "save_dir": str(save_dir)},
        {**BASE, "name": "ac", "activation_checkpointing": AC},
        {"name": "partition_acts", "kind": "partition_activations"},
        {"name": "modifier", "kind": "modifier"},
        {"name": "memory", "steps": 6, "global_batch": 4, "model": MEM_MODEL, "zero": MEM_LIMITS},
        {
            **BASE,
            "name": "save16",
            "steps": 4,
            "zero": {**BASE["zero"], "stage3_gather_16bit_weights_on_model_save": True},
            "save16": True,
            "save_dir": str(out / "ckpt16"),
        },
        # Last: after the expected failure the ranks carry on with nothing else to do.
        {
            **BASE,
            "name": "dynamic",
            "dynamic": True,
            "expect_error": True,
            "zero": {**BASE["zero"], "stage3_check_module_order": True},
        },
    ]
    return launch.run_ranks(cases, 2, out, timeout=300), save_dir


@_on_world2
def test_activation_checkpointing_identical_losses(world2: Any) -> None:
    results, _ = world2
    for r in results:
        assert r["ac"]["losses"] == r["plain"]["losses"]


@_on_world2
def test_partition_activations_split_and_exact(world2: Any) -> None:
    results, _ = world2
    for r in results:
        pa = r["partition_acts"]
        assert pa["loss_equal"] and pa["max_grad_diff"] == 0.0
        assert pa["stash_numel"] == pa["full_numel"] // 2


@_on_world2
def test_ranks_disagreeing_on_module_order_fail_clearly(world2: Any) -> None:
    results, _ = world2
    for r in results:
        err = r["dynamic"]["error"]
        assert err.startswith("ModuleOrderError")
        assert "disagree on the order" in err and "rank 0:" in err and "rank 1:" in err


@pytest.mark.timeout(120)
def test_ranks_diverging_to_parameters_of_another_size_fail_clearly(tmp_path: Path) -> None:
    """Rank 1 skips every block on one step: its next collective moves the output layer while
    rank 0 moves a block. The transfers cannot pair up (gloo would abort on the size mismatch):
    both ranks raise the order error and exit cleanly."""
    # Without prefetch or reuse every module gathers its own parameters as it runs, so rank 0
    # gathers the first block's weights while rank 1 gathers the output layer's.
    zero = {
        "stage3_param_persistence_threshold": 64,
        "stage3_prefetch_bucket_size": 0,
        "stage3_max_reuse_distance": 0,
        "stage3_check_module_order": True,  # the debug option this test is about
    }
    case = {**BASE, "zero": zero, "steps": 3, "name": "skip", "dynamic": "skip"}
    case["expect_error"] = True
    results = launch.run_ranks([case], 2, tmp_path, timeout=100)
    for r in results:
        err = r["skip"]["error"]
        assert err.startswith("ModuleOrderError"), err
        assert "rank 0:" in err and "rank 1:" in err


@_on_world2
def test_resident_parameter_bytes_bounded(world2: Any) -> None:
    results, _ = world2
    for r in results:
        acct = r["memory"]["acct"]
        total = acct["total_bytes"]
        lim = MEM_LIMITS
        # Live window: the max_live budget, plus one module in use beyond it, plus the small
        # parameters kept whole on every rank.
        biggest_module = 4 * MEM_MODEL["d"] * MEM_MODEL["d"] + 4 * MEM_MODEL["d"]
        persistent = 2 * (MEM_MODEL["layers"] * 2 + 1) * MEM_MODEL["d"]
        window = 4 * (lim["stage3_max_live_parameters"] + biggest_module + persistent)
        budget = total // 4
        assert acct["partition_bytes"] <= total // 2 + 4 * 2 * 64  # + per-parameter padding
        assert acct["peak_resident_bytes"] <= total // 2 + window
        assert acct["peak_resident_bytes"] < 3 * budget < total  # never near the whole model


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_checkpoint_reshards_to_world_1_and_3_and_stage2(world2: Any, tmp_path: Path) -> None:
    results, save_dir = world2
    expect = results[0]["plain"]["losses"][7:]
    load = {**BASE, "kind": "load", "save_at": 7, "save_dir": str(save_dir)}
    one = launch.run_ranks(
        [{**load, "name": "s3", "stage": 3}, {**load, "name": "s2", "stage": 2}], 1, tmp_path
    )
    three = launch.run_ranks([{**load, "name": "s3", "stage": 3}], 3, tmp_path)
    assert len(expect) == BASE["steps"] - 7
    for got in (one[0]["s3"]["losses"], one[0]["s2"]["losses"], three[0]["s3"]["losses"]):
        assert got == pytest.approx(expect, rel=1e-5)


@_on_world2
def test_gathered_parameters_modifier_rank_broadcasts(world2: Any) -> None:
    import torch

    results, _ = world2
    for r in results:
        m = r["modifier"]
        assert m["seen"] == (3, 5) and m["after"] == 0
        assert torch.equal(m["weight"], torch.arange(15.0).view(3, 5))
        assert torch.equal(m["bias"], torch.ones(3))
    torch.manual_seed(1000)
    expect = torch.nn.Linear(4, 4).weight.detach()
    for r in results:
        assert torch.equal(r["modifier"]["seeded"], expect)


@_on_world2
def test_16bit_weights_file_equals_single_process_state_dict(world2: Any) -> None:
    """stage3_gather_16bit_weights_on_model_save: save_checkpoint and save_16bit_model write
    the whole model's weights, equal to single-process AdamW's state_dict."""
    import torch

    results, _ = world2
    case = {**BASE, "steps": 4}
    _, ref = launch.load_worker().reference(case)
    files = results[0]["save16"]["files16"]
    assert len(files) == 2
    saved = [torch.load(f, weights_only=True) for f in files]
    for sd in saved:
        assert sorted(sd) == sorted(ref)
        for name, t in ref.items():
            assert sd[name].dtype == t.dtype and sd[name].shape == t.shape
            err = float((sd[name] - t).norm() / t.norm().clamp_min(1e-12))
            assert err <= 1e-5, f"{name}: relative error {err:.2e}"
        for name, t in results[0]["save16"]["weights"].items():
            assert torch.equal(sd[name], t)


@_on_world2
def test_gather_buffer_pool_stays_within_its_budget(world2: Any) -> None:
    """Repeated steps do not grow what the pooled gather/gradient buffers hold: at the end of
    every step the idle buffers fit the pool's budget (none on host: released host buffers go
    back to the heap), what it owns (idle plus the small always-whole parameters) stays level
    from step to step."""
    results, _ = world2
    for r in results:
        # "plain" saves a checkpoint at step 7: its one-parameter gathers use the pool too.
        for name, until in (("memory", None), ("plain", 7)):
            trace = r[name]["pool"][:until]
            budget = r[name]["pool_budget"]
            owned = [t[1] for t in trace]
            idle = [t[2] for t in trace]
            assert max(idle) <= budget, (idle, budget)
            # Bounded, not growing step over step (a buffer a collective still held when it
            # came back may shift the total by a little).
            assert min(owned[2:]) > 0, owned  # the always-whole parameters
            assert max(owned[2:]) - min(owned[2:]) <= max(budget, min(owned[2:])) // 8, owned
