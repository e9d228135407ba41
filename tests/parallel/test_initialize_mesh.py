"""``ds.initialize`` with ``tensor_parallel.autotp_size`` / ``sequence_parallel_size``: 10 steps of
ZeRO on a TP, SP, TP x DP or SP x DP mesh equal one process training the whole model on the
whole batch (fp32; losses and each final weight tensor within 1e-5 relative error)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _init_worker import MICRO, SEQ, STEPS, config  # noqa: E402
from _parity import (  # noqa: E402
    assert_losses_and_norms,
    assert_weight_close,
    train_alone,
    world_fixture,
)
from _ranks_launch import run_scenarios  # noqa: E402
from _tp_models import batch, model  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(420)]


def _world(world: int, out: Path, scenarios: list[str], **env: str) -> dict[str, dict]:
    return run_scenarios(HERE / "_init_worker.py", world, out, scenarios, 400, env)


def _reference(kind: str, dp: int) -> dict:
    """One process, the whole model, the whole (dp-wide) batch: torch AdamW and clipping."""
    torch.set_num_threads(1)
    net = model(kind)
    params = config(1, 1, 0)["optimizer"]["params"]

    def loss_at(step: int) -> torch.Tensor:
        ids = batch(step, size=MICRO * dp, seq=SEQ)
        return net(input_ids=ids, labels=ids).loss

    return train_alone(net, params["lr"], STEPS, 0.5, loss_at)


def _assert_same(got: dict, want: dict) -> None:
    # The global gradient norm (clipping is active: it is above 0.5 every step) counts each
    # tensor-parallel slice once and each replicated parameter once.
    assert_losses_and_norms(got, want)
    assert set(got["weights"]) == set(want["weights"])
    for name, w in want["weights"].items():
        # The TP/SP reductions sum in another order than the one process does.
        if name.endswith("k_proj.bias"):
            # Its exact gradient is zero (adding q.b_k to every score of a query leaves the
            # softmax unchanged): Adam steps on rounding noise of either run, up to lr a step.
            lr = config(1, 1, 0)["optimizer"]["params"]["lr"]
            torch.testing.assert_close(got["weights"][name], w, rtol=0, atol=lr * STEPS)
            continue
        assert_weight_close(name, got["weights"][name], w)


# kind:tp:sp:stage[:flag]; "resume" saves after 5 steps, loads into a differently initialised
# model and finishes: the last 5 steps continue as if nothing happened. "deepspeed" goes through
# deepspeed.tp_model_init and deepspeed.initialize of the compatibility shim. "to1"/"to2" save
# after 5 steps and finish at TP=1 / TP=2 from that checkpoint (resharded slices, masters and
# optimizer moments).
WORLD2 = [
    "llama:1:1:0",
    "llama:2:1:0",
    "qwen2:2:1:2",
    "llama:2:1:3",
    "llama:1:2:1",
    "qwen2:1:2:2",
    "llama:2:1:1:resume",
    "llama:2:1:2:resume",
    "qwen2:2:1:1:deepspeed",
    "llama:2:1:1:to1",
    "qwen2:1:1:2:to2",
]
WORLD4 = ["llama:2:1:1", "qwen2:2:1:3", "qwen2:1:2:2", "llama:1:2:3", "qwen2:2:1:2:export"]


world2 = world_fixture(_world, 2, WORLD2)
world4 = world_fixture(_world, 4, WORLD4)


def _check(results: dict[str, dict], scenario: str, world: int) -> None:
    kind, tp, sp, _stage, *flag = scenario.split(":")
    # Resharding runs keep the global batch at MICRO rows (one data-parallel rank's worth).
    dp = 1 if flag in (["to1"], ["to2"]) else world // (int(tp) * int(sp))
    _assert_same(results[scenario], _reference(kind, dp))


@pytest.mark.parametrize("scenario", WORLD2)
def test_world_of_two_matches_one_process(world2: dict[str, dict], scenario: str) -> None:
    _check(world2, scenario, 2)


@pytest.mark.slow
@pytest.mark.parametrize("scenario", WORLD4)
def test_world_of_four_matches_one_process(world4: dict[str, dict], scenario: str) -> None:
    _check(world4, scenario, 4)


def test_tp2_halves_the_sliced_state_per_rank(world2: dict[str, dict]) -> None:
    # The engine's own accounting, TP=2 against plain data parallelism at the same world and
    # stage: parameter and optimizer bytes shrink by exactly the fraction of elements a rank
    # keeps (slices halve; norms stay whole), which for this model is just over half.
    one, two = world2["llama:1:1:0"]["memory"], world2["llama:2:1:0"]["memory"]
    kept = two["local_numel"] / one["local_numel"]
    assert 0.5 < kept < 0.52, kept
    for key in ("parameter", "optimizer"):
        assert two[key] == pytest.approx(kept * one[key], rel=1e-9), key


@pytest.mark.slow
def test_tp2_x_dp2_exports_one_model_from_pretrained_loads(world4: dict[str, dict]) -> None:
    import transformers

    # save_16bit_model reassembles the slices; rank 0 of TP index 0 writes one safetensors file.
    result = world4["qwen2:2:1:2:export"]
    export = result["dir"] / "export"
    assert sorted(p.name for p in export.iterdir()) == ["config.json", "model.safetensors"]
    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(export)).float()
    for name, w in loaded.state_dict().items():
        torch.testing.assert_close(w, result["weights"][name], rtol=0, atol=0, msg=name)
    ref = _reference("qwen2", 2)
    _assert_same(result, ref)


@pytest.mark.slow
def test_tp2_x_dp2_checkpoint_loads_at_other_layouts_and_worlds(tmp_path: Path) -> None:
    # Five steps at TP=2 x DP=2 (world 4), saved; the last five at TP=1 x DP=1 (world 1) and
    # TP=2 x DP=1 (world 2) from that checkpoint (TP joined, DP partitions gathered; TP kept, DP
    # shrunk), each equal to one process training all ten steps on the same 4-row batches.
    ckpt = tmp_path / "ckpt"
    env = {"DS_TEST_CKPT": str(ckpt), "DS_TEST_ROWS": "4"}
    first = _world(4, tmp_path / "save", ["llama:2:1:1:save"], **env)["llama:2:1:1:save"]
    want = _reference("llama", 2)
    for world, tp in ((1, 1), (2, 2)):
        scenario = f"llama:{tp}:1:1:load"
        second = _world(world, tmp_path / f"load{world}-{tp}", [scenario], **env)[scenario]
        got = {
            "losses": first["losses"] + second["losses"],
            "norms": first["norms"] + second["norms"],
            "weights": second["weights"],
        }
        _assert_same(got, want)
