"""One rank of a multi-process checkpoint/ledger test (run as a script by test_multiprocess.py).

argv: mode rank world port directory [extra]
"""

from __future__ import annotations

import json
import os
import sys

import torch

from ds.checkpoint.engine import ShardedCheckpointEngine
from ds.checkpoint.ledger import RunLedger
from ds.checkpoint.sharding import even_requests
from ds.interfaces import registry
from ds.interfaces.checkpoint import ShardedStateDict, ShardedTensor, TensorMeta


def reference_tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1234)
    return {
        "embed.weight": torch.randn(37, 11, generator=g),
        "layers.0.bias": torch.randn(101, generator=g),
        "layers.0.weight": torch.randn(3, 5, 7, generator=g).to(torch.bfloat16),
        "layers.1.weight": torch.randn(64, 9, generator=g).to(torch.float16),
        "optim.step_count": torch.tensor([12], dtype=torch.int64),
        "tiny": torch.randn(1, generator=g),
    }


def flat_partition(tensors: dict[str, torch.Tensor], rank: int, world: int) -> ShardedStateDict:
    """ZeRO-style: all tensors concatenated, cut into equal flat ranges across ranks."""
    total = sum(t.numel() for t in tensors.values())
    per = -(-total // world)
    lo, hi = rank * per, min(total, (rank + 1) * per)
    out = ShardedStateDict()
    pos = 0
    for name, t in tensors.items():
        start, stop = max(lo, pos), min(hi, pos + t.numel())
        if start < stop:
            meta = TensorMeta(name, tuple(t.shape), str(t.dtype).removeprefix("torch."))
            local = t.reshape(-1)[start - pos : stop - pos].clone()
            out.tensors[name] = ShardedTensor(meta, start - pos, local)
        pos += t.numel()
    return out


def main() -> int:
    mode, rank, world, port, directory = (
        sys.argv[1],
        int(sys.argv[2]),
        int(sys.argv[3]),
        sys.argv[4],
        sys.argv[5],
    )
    comm = registry.get(registry.COMM_BACKENDS, "torch")()
    comm.init_process_group("gloo", f"tcp://127.0.0.1:{port}", rank, world, 60.0)
    ref = reference_tensors()
    if mode in ("save", "save_async"):
        ledger = RunLedger(os.path.join(directory, "ledger.jsonl"), comm=comm)
        ledger.record_training_event("step", {"step": 5, "rank_says": rank})
        eng = ShardedCheckpointEngine(comm, ledger=ledger)
        state = flat_partition(ref, rank, world)
        state.objects = {"step": 5, "world": world}
        state.rank_objects = {"rank": rank, "rng": torch.Generator().manual_seed(rank).get_state()}
        handle = eng.save(
            os.path.join(directory, "ck"), "step5", state, async_save=mode == "save_async"
        )
        if mode == "save_async":
            for st in state.tensors.values():
                st.local.mul_(-3)  # training goes on while the save runs
            handle.wait()
        ledger.record_training_event("step", {"step": 6, "rank_says": rank})
        size = len(ledger)
        ledger.close()
        print(json.dumps({"rank": rank, "ledger_size": size}))
    elif mode == "load":
        eng = ShardedCheckpointEngine(comm)
        ck = os.path.join(directory, "ck")
        metas = eng.metadata(ck)
        out = eng.load(ck, None, even_requests(metas.values(), rank, world))
        for name, t in ref.items():
            st = out.tensors[name]
            expect = t.reshape(-1)[st.offset : st.offset + st.local.numel()]
            assert torch.equal(st.local, expect), name
        assert out.objects == {"step": 5, "world": 2}, out.objects
        if rank < 2:
            assert out.rank_objects["rank"] == rank
        else:
            assert out.rank_objects == {}
        # Together the ranks cover every element exactly once.
        counts = torch.tensor([sum(st.local.numel() for st in out.tensors.values())])
        comm.all_reduce(counts)
        assert int(counts) == sum(t.numel() for t in ref.values())
        print(json.dumps({"rank": rank, "ok": True}))
    comm.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
