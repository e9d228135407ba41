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
from _tp_launch import free_port  # noqa: E402
from _tp_models import batch, model  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(240)]


def _world(kind: str, tp: int, sp: int, stage: int, world: int, out: Path, *extra: str) -> dict:
    port = str(free_port())
    env = dict(os.environ, OMP_NUM_THREADS="1", TRANSFORMERS_VERBOSITY="error")
    cmd = [sys.executable, str(HERE / "_init_worker.py"), kind, str(tp), str(sp), str(stage)]
    procs = [
        subprocess.Popen(
            [*cmd, str(r), str(world), port, str(out), *extra],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for r in range(world)
    ]
    texts = []
    try:
        for p in procs:
            texts.append(p.communicate(timeout=200)[0].decode(errors="replace"))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for rank, (p, text) in enumerate(zip(procs, texts)):
        assert p.returncode == 0, f"rank {rank} failed ({p.returncode}):\n{text[-5000:]}"
    return torch.load(out / "result.pt", weights_only=False)


def _reference(kind: str, dp: int) -> dict:
    """One process, the whole model, the whole (dp-wide) batch: torch AdamW and clipping."""
    torch.set_num_threads(1)
    net = model(kind)
    params = config(1, 1, 0)["optimizer"]["params"]
    opt = torch.optim.AdamW(net.parameters(), lr=params["lr"], weight_decay=0.0)
    losses = []
    for step in range(STEPS):
        ids = batch(step, size=MICRO * dp, seq=SEQ)
        loss = net(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 0.5)
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    return {"losses": losses, "weights": {k: v.detach() for k, v in net.state_dict().items()}}


def _assert_same(got: dict, want: dict) -> None:
    torch.testing.assert_close(
        torch.tensor(got["losses"]), torch.tensor(want["losses"]), rtol=1e-5, atol=1e-6
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


CASES = [
    # kind, tp, sp, stage, world
    pytest.param("llama", 2, 1, 0, 2, id="llama-tp2-zero0"),
    pytest.param("qwen2", 2, 1, 2, 2, id="qwen2-tp2-zero2"),
    pytest.param("llama", 1, 2, 1, 2, id="llama-sp2-zero1"),
    pytest.param("qwen2", 1, 2, 2, 2, id="qwen2-sp2-zero2"),
    pytest.param("llama", 2, 1, 1, 4, id="llama-tp2xdp2-zero1", marks=pytest.mark.slow),
    pytest.param("qwen2", 1, 2, 2, 4, id="qwen2-sp2xdp2-zero2", marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("kind", "tp", "sp", "stage", "world"), CASES)
def test_mesh_training_matches_one_process(
    kind: str, tp: int, sp: int, stage: int, world: int, tmp_path: Path
) -> None:
    got = _world(kind, tp, sp, stage, world, tmp_path)
    _assert_same(got, _reference(kind, world // (tp * sp)))


@pytest.mark.parametrize("stage", [1, 2])
def test_tp_checkpoint_resumes_exactly(stage: int, tmp_path: Path) -> None:
    # Saved after 5 steps at TP=2, loaded into a differently initialised model: the last 5
    # steps continue as if nothing happened.
    got = _world("llama", 2, 1, stage, 2, tmp_path, "resume")
    _assert_same(got, _reference("llama", 1))
