"""``ds.initialize`` with ``tensor_parallel.autotp_size`` / ``sequence_parallel_size``: 10 steps of
ZeRO on a TP, SP, TP x DP or SP x DP mesh equal one process training the whole model on the
whole batch (fp32; losses and each final weight tensor within 1e-5 relative error)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _init_worker import MICRO, SEQ, STEPS, config  # noqa: E402
from _tp_models import batch, model  # noqa: E402
from world import free_port  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(420)]


def _world(world: int, out: Path, scenarios: list[str], **extra_env: str) -> dict[str, dict]:
    port = str(free_port())
    env = dict(os.environ, OMP_NUM_THREADS="1", TRANSFORMERS_VERBOSITY="error", **extra_env)
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "_init_worker.py"), str(r), str(world), port, str(out)]
            + scenarios,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for r in range(world)
    ]
    texts = []
    try:
        for p in procs:
            texts.append(p.communicate(timeout=400)[0].decode(errors="replace"))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for rank, (p, text) in enumerate(zip(procs, texts)):
        assert p.returncode == 0, f"rank {rank} failed ({p.returncode}):\n{text[-5000:]}"
    results = {}
    for s in scenarios:
        where = out / s.replace(":", "-")
        results[s] = {**torch.load(where / "result.pt", weights_only=False), "dir": where}
    return results


def _reference(kind: str, dp: int) -> dict:
    """One process, the whole model, the whole (dp-wide) batch: torch AdamW and clipping."""
    torch.set_num_threads(1)
    net = model(kind)
    params = config(1, 1, 0)["optimizer"]["params"]
    opt = torch.optim.AdamW(net.parameters(), lr=params["lr"], weight_decay=0.0)
    losses, norms = [], []
    for step in range(STEPS):
        ids = batch(step, size=MICRO * dp, seq=SEQ)
        loss = net(input_ids=ids, labels=ids).loss
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(net.parameters(), 0.5)))
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    return {
        "losses": losses,
        "norms": norms,
        "weights": {k: v.detach() for k, v in net.state_dict().items()},
    }


def _assert_same(got: dict, want: dict) -> None:
    torch.testing.assert_close(
        torch.tensor(got["losses"]), torch.tensor(want["losses"]), rtol=1e-5, atol=1e-6
    )
    # The global gradient norm (clipping is active: it is above 0.5 every step) counts each
    # tensor-parallel slice once and each replicated parameter once.
    torch.testing.assert_close(
        torch.tensor(got["norms"]), torch.tensor(want["norms"]), rtol=1e-5, atol=0
    )
    assert set(got["weights"]) == set(want["weights"])
    for name, w in want["weights"].items():
        # Relative error of each tensor (norm of the difference over the norm): Adam turns
        # last-bit differences of near-zero gradients (the TP/SP reductions sum in another
        # order) into steps of up to lr on single elements, so elementwise bounds are noise.
        if name.endswith("k_proj.bias"):
            # Its exact gradient is zero (adding q.b_k to every score of a query leaves the
            # softmax unchanged): Adam steps on rounding noise of either run, up to lr a step.
            lr = config(1, 1, 0)["optimizer"]["params"]["lr"]
            torch.testing.assert_close(got["weights"][name], w, rtol=0, atol=lr * STEPS)
            continue
        err = float(torch.linalg.vector_norm(got["weights"][name] - w))
        assert err <= 1e-5 * float(torch.linalg.vector_norm(w)), f"{name}: relative error {err}"


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


@pytest.fixture(scope="module")
def world2(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    return _world(2, tmp_path_factory.mktemp("world2"), WORLD2)


@pytest.fixture(scope="module")
def world4(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    return _world(4, tmp_path_factory.mktemp("world4"), WORLD4)


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
