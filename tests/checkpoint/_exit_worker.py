"""A rank that ends like the main job (examples/train_gpt.py) with collectives still in flight.

ZeRO's overlapped reduction leaves gloo work queued behind the caller; here 64 asynchronous
all-reduces of tensors made in Python are issued and only the first is waited on, which widens
the exit race the main job hits about once in four runs to most runs. ``EXIT_PATH=example`` ends
through train_gpt.py's ``shutdown``; ``EXIT_PATH=plain`` just returns (the old ending);
``EXIT_PATH=full`` joins through ``ds.full.init_distributed`` and just returns, so its exit hook
must leave the group.
"""

import importlib.util
import os
import sys
from pathlib import Path

import torch

from ds import comm as dist

ROOT = Path(__file__).resolve().parents[2]
if os.environ.get("EXIT_PATH") == "full":
    import ds.full

    ds.full.init_distributed()
else:
    dist.init_distributed()
tensors = [torch.ones(1 << 14) for _ in range(64)]
works = [dist.all_reduce(t, async_op=True) for t in tensors]
works[0].wait()
del tensors, works
if os.environ.get("EXIT_PATH", "example") == "example":
    spec = importlib.util.spec_from_file_location("train_gpt", ROOT / "examples" / "train_gpt.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.shutdown(None)
sys.exit(0)
