"""Peak memory of consolidating a sharded checkpoint: ds streaming export vs load-all-then-save.

A checkpoint of ``--mib`` MiB in 16 float32 tensors (the largest 1/8 of the total) is exported by
each implementation in a fresh process that reports its peak RSS (VmHWM, reset after imports)
above its RSS before reading anything. Linux only.

    .venv/bin/python tools/bench/checkpoint_export.py [--mib 512]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Bench


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{key} not in /proc/self/status")


def _child(kind: str, ck: str, out: str) -> None:
    import torch

    from ds.checkpoint import export as ex
    from ds.checkpoint.engine import ShardedCheckpointEngine
    from ds.checkpoint.sharding import full_requests

    eng = ShardedCheckpointEngine()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets the peak (VmHWM) to the current RSS: the import peak does not count
    base = _status_kib("VmRSS")
    t0 = time.perf_counter()
    m = eng.manifest(ck)
    root = eng.checkpoint_dir(ck, None)
    if kind == "ds-safetensors":
        ex.export_safetensors(m, root, out, ex.plan_export(m))
    elif kind == "ds-torch":
        ex.export_torch(m, root, out, ex.plan_export(m))
    else:  # the usual way: materialize the whole model, then save it
        from safetensors.torch import save_file

        metas = eng.metadata(ck)
        full = eng.load(ck, None, full_requests(metas.values()), rank_objects=False)
        sd = {n: st.local.view(metas[n].shape) for n, st in full.tensors.items()}
        if kind == "load-all + safetensors.save_file":
            save_file(sd, out)
        else:
            torch.save(sd, out)
    dt = time.perf_counter() - t0
    peak = _status_kib("VmHWM")
    print(json.dumps({"extra_rss_mib": (peak - base) / 1024, "seconds": dt}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--child", nargs=3, default=None)
    args = ap.parse_args()
    if args.child:
        _child(*args.child)
        return
    import torch

    from ds.checkpoint.engine import ShardedCheckpointEngine
    from ds.checkpoint.sharding import shard_state

    d = tempfile.mkdtemp(prefix="ds-export-bench-")
    ck = os.path.join(d, "ck")
    total = args.mib << 20
    sizes = [total // 8] * 4 + [total // 32] * 12 + [0]  # 4 x 1/8 + 12 x 1/32 = total
    sizes = [s for s in sizes if s]
    tensors = {f"layer{i}.weight": torch.randn(s // 4 // 256, 256) for i, s in enumerate(sizes)}
    largest = max(t.numel() * 4 for t in tensors.values())
    eng = ShardedCheckpointEngine()
    eng.save(ck, "t", shard_state(tensors, 0, 1))
    del tensors
    bench = Bench("checkpoint_export", peer="load-all + safetensors.save_file", unit="s")
    kinds = [
        "ds-safetensors",
        "ds-torch",
        "load-all + safetensors.save_file",
        "load-all + torch.save",
    ]
    for kind in kinds:
        out = os.path.join(d, "out.bin")
        res = subprocess.run(
            [sys.executable, __file__, "--child", kind, ck, out],
            capture_output=True,
            text=True,
            check=True,
        )
        r = json.loads(res.stdout.strip().splitlines()[-1])
        bench.add(
            kind,
            f"export {args.mib} MiB (largest tensor {largest >> 20} MiB)",
            [r["seconds"]],
            work_bytes=total,
            peak_extra_rss_mib=r["extra_rss_mib"],
        )
        os.unlink(out)
    shutil.rmtree(d, ignore_errors=True)
    bench.report()


if __name__ == "__main__":
    main()
