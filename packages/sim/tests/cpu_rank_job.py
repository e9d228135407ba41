"""One CPU-rank training job, run for real (``python cpu_rank_job.py OUT SWAP_DIR``) or handed to
the simulation (``build``, ``config``): ZeRO-3 with parameters and optimizer state on NVMe, fp32,
AdamW, one rank, two steps.

The model is an embedding, four square layers and an output head: the two 8.4M-element matrices
at the ends size the swap buffers, which the layers' 1M-element partitions then reuse in part,
and the 21M parameters make the memory that depends on the model (about 250 MB) large beside
what a process's RSS moves by otherwise (code pages, the heap: a few MB).

The real run reports the peak RSS of the build (model, engine, swap files written) and of the
steps, each above the RSS the process had before building; a warm-up job on a tiny model of the
same kind runs first, so the code pages, kernels and I/O threads the job needs are resident in
that baseline, as they are in the simulation's runtime.
"""

from __future__ import annotations

import gc
import json
import sys
from typing import Any

import torch
import torch.nn.functional as F

VOCAB, HIDDEN, LAYERS, SEQ = 8192, 1024, 4, 32


class TinyLM(torch.nn.Module):
    def __init__(self, vocab: int = VOCAB, hidden: int = HIDDEN, layers: int = LAYERS) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(hidden, hidden) for _ in range(layers))
        self.head = torch.nn.Linear(hidden, vocab, bias=False)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for layer in self.layers:
            x = torch.relu(layer(x))
        logits = self.head(x)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), labels.view(-1))


def build(device: torch.device) -> torch.nn.Module:
    with torch.device(device):
        return TinyLM()


def config(nvme_path: str) -> dict[str, Any]:
    where = {"device": "nvme", "nvme_path": nvme_path, "buffer_count": 2}
    return {
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.0}},
        "zero_optimization": {
            "stage": 3,
            "offload_param": dict(where),
            "offload_optimizer": dict(where),
        },
        "steps_per_print": 10**9,
    }


def _steps(engine: Any, vocab: int, steps: int = 2) -> list[float]:
    ids = torch.randint(0, vocab, (1, SEQ))
    losses = []
    for _ in range(steps):
        loss = engine(input_ids=ids, labels=ids)
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
    return losses


def main(out: str, nvme_path: str) -> None:
    import ds.full as ds
    from ds.accel.cpu import CpuAccelerator

    rss = CpuAccelerator()  # the process's RSS (VmRSS, VmHWM; the peak resets to the current)
    ds.init_distributed()
    torch.manual_seed(0)
    warm, *_ = ds.initialize(model=TinyLM(64, 64, 1), config=config(nvme_path))
    _steps(warm, 64)
    warm.destroy()
    del warm
    gc.collect()
    rss.reset_peak_memory_stats()
    base = rss.memory_allocated()
    engine, *_ = ds.initialize(model=build(torch.device("cpu")), config=config(nvme_path))
    build_peak = rss.max_memory_allocated() - base
    rss.reset_peak_memory_stats()
    losses = _steps(engine, VOCAB)
    step_peak = rss.max_memory_allocated() - base
    engine.destroy()
    with open(out, "w") as f:
        json.dump({"build_peak": build_peak, "step_peak": step_peak, "losses": losses}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
