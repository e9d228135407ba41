"""Peak memory of consolidating a DeepSpeed ZeRO checkpoint: ``ds checkpoint export`` vs DeepSpeed's
``zero_to_fp32`` (both to safetensors), on a checkpoint a real DeepSpeed saves here.

    DS_ACCELERATOR=cpu /work/dsref/bin/torchrun --nproc_per_node 2 \
        tools/bench/deepspeed_export_memory.py save DIR [LAYERS]
    python tools/bench/deepspeed_export_memory.py measure DIR DEEPSPEED_PYTHON

``measure`` runs each tool in its own process under GNU time and prints its peak RSS, one JSON
line per tool.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time


def save(directory: str, layers: int) -> None:
    import deepspeed
    import torch

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(layers)])
    cfg = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_optimization": {"stage": 2},
    }
    eng, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    loss = eng(torch.randn(2, 2048)).square().mean()
    eng.backward(loss)
    eng.step()
    eng.save_checkpoint(directory)


def _peak(cmd: list[str]) -> dict[str, object]:
    """Run ``cmd`` under GNU time; its peak RSS (KiB, %M) is the last line of stderr."""
    t0 = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-f", "%M", *cmd], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    lines = proc.stderr.strip().splitlines()
    peak_kib = int(lines[-1]) if lines and lines[-1].isdigit() else -1
    return {"rc": proc.returncode, "wall_s": round(wall, 1), "peak_rss_mib": peak_kib // 1024,
            "tail": (proc.stdout + proc.stderr)[-300:] if proc.returncode else ""}  # fmt: skip


def measure(directory: str, deepspeed_python: str) -> None:
    size = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(directory) for f in fs)
    print(json.dumps({"checkpoint_mib": size // 2**20}))
    ds = [sys.executable, "-m", "ds.launcher", "checkpoint", "export", directory,
          directory + "-ds", "--safe_serialization"]  # fmt: skip
    print(json.dumps({"tool": "ds checkpoint export", **_peak(ds)}))
    zs = [deepspeed_python, "-m", "deepspeed.utils.zero_to_fp32", directory,
          directory + "-deepspeed", "--safe_serialization"]  # fmt: skip
    print(json.dumps({"tool": "deepspeed zero_to_fp32", **_peak(zs)}))


if __name__ == "__main__":
    if sys.argv[1] == "save":
        save(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 6)
    else:
        measure(sys.argv[2], sys.argv[3])
