"""AutoEP: a tiny transformers Mixtral whose sparse MoE blocks ``ds.initialize`` makes expert
parallel from ``expert_parallel.autoep_size`` alone. At EP=2 (world 2, ZeRO 0) each rank's logits
and the first step's reduced gradients equal transformers' own model on the whole batch, and five
AdamW steps end at the same losses and weights (fp32, 1e-5); save_16bit_model writes one
model that ``from_pretrained`` loads; a checkpoint saved at EP=2 finishes the run at EP=1."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from tiny_models import llama_shape

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _autoep_worker import MICRO, STEPS, batch, tiny_mixtral  # noqa: E402
from _ranks_launch import run_ranks  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(240)]


def _run(world: int, ep: int, stage: int, out: Path) -> list[dict]:
    run_ranks(HERE / "_autoep_worker.py", world, [str(out), str(ep), str(stage)], timeout=220)
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


@pytest.mark.slow
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
    # Saved at EP=2 after half the steps, finished at EP=1: the same losses and weights.
    resharded = [torch.load(tmp_path / f"reshard{r}.pt", weights_only=False) for r in range(world)]
    torch.testing.assert_close(
        torch.tensor(resharded[0]["losses"]), torch.tensor(losses), rtol=1e-5, atol=1e-6
    )
    weights = _merged(resharded, "weights")
    for name, w in ref.state_dict().items():
        _close(weights[name], w, name)


@pytest.mark.parametrize("family", ["qwen2_moe", "qwen3_moe"])
def test_autoep_replaces_qwen_moe_experts_and_keeps_the_forward(family: str) -> None:
    # One process (autoep_size=1): the swap itself (every expert loaded from the fused
    # tensors, transformers' router and shared expert kept) leaves logits and gradients as they were.
    import transformers

    import ds.full as ds
    from ds.parallel.moe.autoep import ExpertParallelExperts

    moe = dict(moe_intermediate_size=12, num_experts=4, num_experts_per_tok=2)
    moe["norm_topk_prob"] = family == "qwen3_moe"
    common = llama_shape(16, 24, heads=2, kv_heads=1, vocab=64, positions=64, **moe)
    if family == "qwen2_moe":
        cfg, cls = (
            transformers.Qwen2MoeConfig(shared_expert_intermediate_size=8, **common),
            transformers.Qwen2MoeForCausalLM,
        )
    else:
        cfg, cls = transformers.Qwen3MoeConfig(**common), transformers.Qwen3MoeForCausalLM
    torch.manual_seed(0)
    ref = cls(cfg).float()
    torch.manual_seed(0)
    net = cls(cfg).float()
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": 1},
        "expert_parallel": {"enabled": True, "autoep_size": 1},
    }
    engine, _, _, _ = ds.initialize(model=net, config=config)
    swapped = [m for m in engine.module.modules() if isinstance(m, ExpertParallelExperts)]
    assert len(swapped) == 2
    ids = batch(0, 2)
    got = engine(input_ids=ids, labels=ids)
    want = ref(input_ids=ids, labels=ids)
    torch.testing.assert_close(got.logits, want.logits, rtol=1e-5, atol=1e-5)
    engine.backward(got.loss)
    want.loss.backward()
    router = "model.layers.0.mlp.gate.weight"
    grads = dict(engine.module.named_parameters())
    torch.testing.assert_close(grads[router].grad, dict(ref.named_parameters())[router].grad)
    expert = grads["model.layers.0.mlp.experts.gate_up_proj.3"].grad
    torch.testing.assert_close(expert, ref.model.layers[0].mlp.experts.gate_up_proj.grad[3])


def test_deepspeed_layout_autoep_keeps_mixtrals_loss_router_logits_and_grads() -> None:
    # DeepSpeed's AutoEP API (ds.parallel.moe.autoep_layer): transformers' router stays the gate,
    # so output_router_logits (and the auxiliary loss) still see it.
    import copy

    from ds.parallel.moe.autoep_config import AutoEPConfig
    from ds.parallel.moe.autoep_layer import detect_moe_layers, replace_moe_layer

    ref = tiny_mixtral()
    net = copy.deepcopy(ref)
    config = AutoEPConfig(enabled=True, preset_model="mixtral")
    for spec in detect_moe_layers(net, config):
        replace_moe_layer(net, spec, 1, 0, config)
    ids = batch(0, 2)
    want = ref(input_ids=ids, labels=ids, output_router_logits=True)
    got = net(input_ids=ids, labels=ids, output_router_logits=True)
    torch.testing.assert_close(got.router_logits[0], want.router_logits[0])
    torch.testing.assert_close(got.loss, want.loss, rtol=1e-5, atol=1e-6)
    got.loss.backward()
    want.loss.backward()
    w1 = net.model.layers[0].mlp.experts.w1.grad
    inter = w1.shape[1]
    torch.testing.assert_close(w1, ref.model.layers[0].mlp.experts.gate_up_proj.grad[:, :inter])
