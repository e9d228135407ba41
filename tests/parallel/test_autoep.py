"""AutoEP: a tiny transformers Mixtral whose sparse MoE blocks ``ds.initialize`` makes expert
parallel from ``expert_parallel.autoep_size`` alone. At EP=2 (world 2, ZeRO 0) each rank's logits
and the first step's reduced gradients equal transformers' own model on the whole batch, and five
AdamW steps end at the same losses and weights (fp32, 1e-5); save_16bit_model writes one
model that ``from_pretrained`` loads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _autoep_worker import MICRO, STEPS, batch, tiny_mixtral  # noqa: E402
from _tp_launch import free_port  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(240)]


def _run(world: int, ep: int, stage: int, out: Path) -> list[dict]:
    port = str(free_port())
    env = dict(os.environ, OMP_NUM_THREADS="1", TRANSFORMERS_VERBOSITY="error")
    args = [str(world), port, str(out), str(ep), str(stage)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "_autoep_worker.py"), str(r), *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for r in range(world)
    ]
    texts = []
    try:
        for p in procs:
            texts.append(p.communicate(timeout=220)[0].decode(errors="replace"))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for rank, (p, text) in enumerate(zip(procs, texts)):
        assert p.returncode == 0, f"rank {rank} failed ({p.returncode}):\n{text[-5000:]}"
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world)]


def _merged(parts: list[dict], key: str) -> dict[str, torch.Tensor]:
    from ds.parallel.moe.autoep import fused_state_dict

    merged: dict[str, torch.Tensor] = {}
    for part in parts:
        merged.update(part[key])
    return fused_state_dict(merged)


def _close(got: torch.Tensor, want: torch.Tensor, name: str) -> None:
    err = float(torch.linalg.vector_norm(got - want))
    assert err <= 1e-5 * float(torch.linalg.vector_norm(want)) + 1e-9, f"{name}: error {err}"


def test_autoep2_matches_transformers(tmp_path: Path) -> None:
    world = 2
    parts = _run(world, 2, 0, tmp_path)
    # Every rank holds half the experts: names by global expert index, two per rank.
    for r, part in enumerate(parts):
        local = {n.rsplit(".", 1)[1] for n in part["weights"] if ".experts.gate_up_proj." in n}
        assert local == {str(2 * r), str(2 * r + 1)}, local
    torch.set_num_threads(1)
    ref = tiny_mixtral()
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-3, weight_decay=0.0)
    losses = []
    for step in range(STEPS):
        ids = batch(step, MICRO * world)
        result = ref(input_ids=ids, labels=ids)
        result.loss.backward()
        if step == 0:
            for r, part in enumerate(parts):
                want = result.logits.detach()[r * MICRO : (r + 1) * MICRO]
                torch.testing.assert_close(part["logits"], want, rtol=1e-5, atol=1e-5)
            grads = _merged(parts, "grads")
            for name, p in ref.named_parameters():
                _close(grads[name], p.grad, name)
        opt.step()
        opt.zero_grad()
        losses.append(float(result.loss.detach()))
    torch.testing.assert_close(
        torch.tensor(parts[0]["losses"]), torch.tensor(losses), rtol=1e-5, atol=1e-6
    )
    weights = _merged(parts, "weights")
    assert set(weights) == set(ref.state_dict())
    for name, w in ref.state_dict().items():
        _close(weights[name], w, name)
    import transformers

    exported = transformers.MixtralForCausalLM.from_pretrained(str(tmp_path / "export")).float()
    for name, w in exported.state_dict().items():
        torch.testing.assert_close(w, weights[name], rtol=0, atol=0, msg=name)
