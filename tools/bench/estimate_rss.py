"""``ds estimate`` against the measured peak RSS of real CPU runs at world 2 (docs/planning.md).

    python tools/bench/estimate_rss.py [--sizes small,medium] [--stages 0,1,2,3] [--seq-len 64]

For each model size and ZeRO stage: a real 2-rank gloo run of ``estimate_rss_worker.py`` (two
training steps, bf16, AdamW) gives rank 0's peak RSS; the same point through ``estimate`` with
``backend="gloo"`` gives the simulated bytes. A CPU run holds the simulated device's and host's
bytes in one memory, so the estimate of the peak RSS is the runtime's own RSS (a run of the same
worker with a negligible model) plus the simulated device step peak plus the host peak.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
from models import llama_shape

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

SIZES = {
    # ~21M parameters: 8.4M in the two embeddings, 12.6M in four layers.
    "small": llama_shape(512, 1376, layers=4, heads=8, kv_heads=8, vocab=8192, positions=512),
    # ~84M parameters.
    "medium": llama_shape(1024, 2752, layers=5, heads=16, kv_heads=16, vocab=8192, positions=512),
    # The runtime alone: a model of a few thousand parameters.
    "negligible": llama_shape(16, 32, layers=1, heads=2, kv_heads=2, vocab=64, positions=512),
}


def _config(work: Path, size: str) -> Path:
    path = work / f"{size}.json"
    cfg = {"model_type": "llama", **SIZES[size]}
    path.write_text(json.dumps(cfg))
    return path


def measured(cfg: Path, stage: int, offload: str, seq_len: int, work: Path) -> dict[str, int]:
    out = work / f"rss-{cfg.stem}-{stage}-{offload}.json"
    ds = Path(sys.executable).with_name("ds")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [str(ds), "run", "--nproc", "2", str(HERE / "estimate_rss_worker.py"), str(cfg),
           str(stage), offload, str(seq_len), str(out)]  # fmt: skip
    subprocess.run(cmd, check=True, env=env, cwd=ROOT, timeout=900)
    return json.loads(out.read_text())


def simulated(cfg: Path, stage: int, offload: str, seq_len: int) -> tuple[int, int]:
    from ds.autotune import estimate
    from ds.autotune.model_spec import from_hf_config
    from ds.full.training import initialize  # the engine `ds estimate` measures

    spec = from_hf_config(cfg, torch.bfloat16)
    (row,) = estimate(spec, 2, initialize=initialize, stages=(stage,), offloads=(offload,),
                      seq_len=seq_len, backend="gloo")  # fmt: skip
    return row.device_peak, row.host_peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="small,medium")
    ap.add_argument("--stages", default="0,1,2,3")
    ap.add_argument("--offload", default="none", help="comma list of none,cpu")
    ap.add_argument("--seq-len", type=int, default=64)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ds-estimate-rss-"))
    runtime = measured(_config(work, "negligible"), 0, "none", args.seq_len, work)["peak"]
    print(f"runtime RSS (negligible model, stage 0): {runtime / 2**20:.0f} MiB")
    print("| size | stage | offload | measured peak RSS (MiB) | estimate (MiB) | error |")
    print("|---|---|---|---|---|---|")
    for size in args.sizes.split(","):
        cfg = _config(work, size)
        for stage in (int(s) for s in args.stages.split(",")):
            for offload in args.offload.split(","):
                if offload != "none" and stage == 0:
                    continue
                peak = measured(cfg, stage, offload, args.seq_len, work)["peak"]
                dev, host = simulated(cfg, stage, offload, args.seq_len)
                est = runtime + dev + host
                print(f"| {size} | {stage} | {offload} | {peak / 2**20:.0f} | {est / 2**20:.0f} "
                      f"| {100 * (est - peak) / peak:+.1f}% |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
