"""A real CPU training run for comparing ``ds estimate`` with measured memory (docs/planning.md).

``ds run --nproc 2 tools/bench/estimate_rss_worker.py config.json STAGE none 64 out.json``; run it
once with a negligible model for the runtime's own RSS.

argv: config.json stage offload seq_len out.json. Rank 0 writes its peak RSS over the run and its
RSS just before the model was built (the runtime: Python, torch, ds, the process group).
"""

from __future__ import annotations

import json
import resource
import sys

import torch
from transformers import AutoConfig, AutoModelForCausalLM

import ds.full as ds
from ds.full.training import init_distributed


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


cfg_path, stage, offload, seq_len, out = (
    sys.argv[1],
    int(sys.argv[2]),
    sys.argv[3],
    int(sys.argv[4]),
    sys.argv[5],
)
with open(cfg_path) as f:
    hf = AutoConfig.for_model(**json.load(f))
init_distributed()
torch.manual_seed(0)
baseline = rss()
model = AutoModelForCausalLM.from_config(hf, dtype=torch.bfloat16)
zero = {"stage": stage}
if offload == "cpu":
    zero["offload_optimizer"] = {"device": "cpu"}
config = {
    "train_micro_batch_size_per_gpu": 1,
    "bf16": {"enabled": True},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
    "zero_optimization": zero,
    "steps_per_print": 10**9,
}
engine, *_ = ds.initialize(model=model, config=config)
ids = torch.randint(0, hf.vocab_size, (1, seq_len))
for _ in range(2):
    loss = engine(input_ids=ids, labels=ids).loss
    engine.backward(loss)
    engine.step()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
if engine.rank == 0:
    with open(out, "w") as f:
        json.dump({"baseline": baseline, "peak": peak}, f)
