"""The larger-than-memory route of tools/bench/infinity.py at CI size: a Llama built under
``ds.zero.Init``, ZeRO-3 with parameters and optimizer states on NVMe, through ``ds.initialize``.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import transformers
from tiny_models import llama_shape

import ds.full as ds
from ds.zero import Init
from ds.zero.stage3 import shard_of


def test_llama_trains_with_params_and_optimizer_on_nvme(tmp_path: Path) -> None:
    cfg = transformers.LlamaConfig(**llama_shape(32, 64, heads=4, vocab=128, positions=64))
    where = {"device": "nvme", "nvme_path": str(tmp_path), "buffer_count": 2}
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.0}},
        "zero_optimization": {
            "stage": 3,
            "stage3_param_persistence_threshold": 0,
            "offload_param": dict(where),
            "offload_optimizer": dict(where),
        },
        "aio": {"block_size": 4096, "queue_depth": 2},
        "steps_per_print": 10**9,
    }
    torch.manual_seed(0)
    with Init(config_dict_or_path=config):
        model = transformers.LlamaForCausalLM(cfg)
    engine, *_ = ds.initialize(model=model, config=config)
    try:
        params = list(model.parameters())
        # Every shard lives in the swap file; none stays in memory between uses.
        assert all(shard_of(p).swapped and shard_of(p).shard.numel() == 0 for p in params)
        numel = sum(shard_of(p).numel for p in params)
        swap = {f.name: f.stat().st_size for f in tmp_path.glob("*.swp")}
        assert set(swap) == {"ds_zero3_params_rank0.swp", "ds_zero3_optim_rank0.swp"}
        assert swap["ds_zero3_params_rank0.swp"] >= 4 * numel
        assert swap["ds_zero3_optim_rank0.swp"] >= 3 * 4 * numel
        ids = torch.randint(0, cfg.vocab_size, (1, 16), generator=torch.Generator().manual_seed(1))
        losses = []
        for _ in range(3):
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        assert all(math.isfinite(x) for x in losses)
        assert losses[-1] < losses[0] - 0.1, losses
    finally:
        engine.destroy()
    assert not list(tmp_path.glob("*.swp"))  # the swap files go with the engine
