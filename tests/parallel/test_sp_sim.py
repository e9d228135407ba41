"""Ulysses SP=4 on the simulated world: device placement and collective discipline (NCCL rules)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from ds.parallel.sequence import sequence_parallel_loss, shard_batch, use_ulysses_attention
from ds.sim.accelerator import SimDevice
from ds.sim.comm import SimWorld

pytestmark = pytest.mark.simgpu

transformers = pytest.importorskip("transformers")

SP, LAYERS, SEQ, BSZ, HEADS, HEAD_DIM = 4, 2, 32, 2, 4, 8


def tiny_llama() -> Any:
    cfg = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=HEADS * HEAD_DIM,
        intermediate_size=64,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=2,  # fewer than SP=4 ranks: each kv head is replicated twice
        max_position_embeddings=64,
        attn_implementation="sdpa",
    )
    return transformers.LlamaForCausalLM(cfg)


def test_sp4_forward_backward_places_and_orders_collectives() -> None:
    world = SimWorld(SP)
    ids = torch.randint(0, 64, (BSZ, SEQ))
    batch = {"input_ids": ids, "labels": ids.clone()}
    grads_on_device = []
    for r in range(SP):
        with world.rank(r) as comm, SimDevice(world.local_rank(r)) as dev:
            group = comm.new_group(list(range(SP)))
            model = tiny_llama().to(dev.device)
            use_ulysses_attention(model, comm, group)
            shard = {k: v.to(dev.device) for k, v in shard_batch(batch, r, SP).items()}
            out = model(input_ids=shard["input_ids"], position_ids=shard["position_ids"])
            res = sequence_parallel_loss(out.logits, shard["shift_labels"], comm, group)
            res.loss.backward()
            grads_on_device.append(
                all(p.grad is not None and p.grad.device == dev.device for p in model.parameters())
            )
            assert not dev.host_syncs, dev.host_syncs  # no .item() on the hot path
    world.check()  # same collectives, same order and sizes on every rank
    assert all(grads_on_device)
    # per layer: q, k, v and the output, each forward and backward, [b, s/sp, h, d] fp32 each
    per_tensor = BSZ * (SEQ // SP) * HEADS * HEAD_DIM * 4
    for r in range(SP):
        assert world.traffic(r)["all_to_all_single"] == LAYERS * 8 * per_tensor
