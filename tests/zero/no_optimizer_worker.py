"""One rank of the ZeRO-3 inference check (``no_optimizer_worker.py RANK WORLD PORT OUT_DIR``):
an engine built without an optimizer partitions the tiny GPT across the ranks and runs it
forward, each rank on its own batches; rank 0 saves what the test compares with plain PyTorch."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _gpt import TinyGPT, batch

from ds.interfaces import registry
from ds.interfaces.errors import ConfigError
from ds.zero.engine import ZeroEngine

CONFIG = {
    "train_micro_batch_size_per_gpu": 2,
    # Every parameter partitioned (none kept whole for being small), so each forward gathers.
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
}


def main() -> None:
    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
    torch.set_num_threads(1)
    comm = registry.get(registry.COMM_BACKENDS, "torch")()
    comm.init_process_group("gloo", f"tcp://127.0.0.1:{port}", rank, world, 120.0)
    torch.manual_seed(0)
    model = TinyGPT()
    reference = copy.deepcopy(model).eval()
    engine = ZeroEngine(model, CONFIG, comm=comm).eval()
    params = list(model.parameters())
    local = sum(p.ds_shard.shard.numel() for p in params)
    whole = sum(p.ds_shard.numel for p in params)
    got, want, released = [], [], []
    with torch.no_grad():
        for step in range(3):
            idx, targets = batch(step * world + rank, 2)  # each rank its own batch
            got.append(engine(idx, targets))
            want.append(reference(idx, targets))
            released.append(all(p.data.numel() == 0 for p in params))
    refused = ""
    try:
        engine.step()
    except ConfigError as e:
        refused = str(e)
    if rank == 0:
        torch.save(
            {"got": got, "want": want, "released": released, "local": local, "whole": whole,
             "optimizer": repr(engine.optimizer), "refused": refused},
            out / "result.pt",
        )  # fmt: skip
    comm.barrier()
    comm.destroy_process_group()


if __name__ == "__main__":
    main()
