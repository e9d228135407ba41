"""File I/O throughput: ds AsyncIOHandle vs plain Python file writes/reads and torch.save/load
of the same bytes, interleaved round-robin in one run.

Writes go to --dir (default: a temporary directory under /var/tmp); every write creates a new
file (the old one is removed inside the timed call, for every implementation). Two write modes:
``cache`` (returns once the kernel has the bytes: page cache, or the device for O_DIRECT) and
``durable`` (every implementation ends with fsync). Reads follow a write of the same file, so
buffered readers are served from the page cache while O_DIRECT reads go to the device.

    python tools/bench/aio.py [--mib 256] [--rounds 5] [--threads 1 2] [--dir /path]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(__file__))
from harness import Bench

from ds.ops.aio import AsyncIOHandle


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def run(mib: int, rounds: int, threads: list[int], directory: str) -> Bench:
    nbytes = mib * 1024 * 1024
    bench = Bench("aio", peer="python-file", unit="ms")
    handles = {
        t: {
            "direct": AsyncIOHandle(intra_op_parallelism=t, use_o_direct=True),
            "buffered": AsyncIOHandle(intra_op_parallelism=t, use_o_direct=False),
        }
        for t in threads
    }
    any_handle = handles[threads[0]]["direct"]
    buf = any_handle.new_pinned_buffer(nbytes)
    buf.copy_(torch.randint(0, 256, (nbytes,), dtype=torch.uint8))
    path = os.path.join(directory, "bench-aio.bin")
    tensor_path = os.path.join(directory, "bench-aio.pt")

    def fresh(p: str) -> None:
        # every implementation writes a new file, as a checkpoint writer does
        if os.path.exists(p):
            os.unlink(p)

    def python_write() -> None:
        fresh(path)
        with open(path, "wb", buffering=0) as f:
            f.write(memoryview(buf.numpy()))

    def torch_save() -> None:
        fresh(tensor_path)
        torch.save(buf, tensor_path)

    for durable in (False, True):
        fns = {}
        for t in threads:
            for mode, h in handles[t].items():

                def ds_write(h: AsyncIOHandle = h, durable: bool = durable) -> None:
                    fresh(path)
                    h.sync_pwrite(buf, path, 0)
                    if durable:
                        _fsync(path)

                fns[f"ds-aio {mode} {t}t"] = ds_write

        def py(durable: bool = durable) -> None:
            python_write()
            if durable:
                _fsync(path)

        def ts(durable: bool = durable) -> None:
            torch_save()
            if durable:
                _fsync(tensor_path)

        fns["python-file"] = py
        fns["torch.save"] = ts
        case = f"write {mib} MiB {'durable' if durable else 'cache'}"
        bench.interleave(case, fns, rounds=rounds, warmup=1, work_bytes=nbytes)

    python_write()
    torch_save()
    out = any_handle.new_pinned_buffer(nbytes)
    fns = {}
    for t in threads:
        for mode, h in handles[t].items():
            fns[f"ds-aio {mode} {t}t"] = lambda h=h: h.sync_pread(out, path, 0)

    def python_read() -> None:
        with open(path, "rb", buffering=0) as f:
            f.readinto(memoryview(out.numpy()))

    fns["python-file"] = python_read
    fns["torch.load"] = lambda: torch.load(tensor_path)
    bench.interleave(f"read {mib} MiB", fns, rounds=rounds, warmup=1, work_bytes=nbytes)
    for hs in handles.values():
        for h in hs.values():
            h.close()
    for p in (path, tensor_path):
        os.unlink(p)
    return bench


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, nargs="+", default=sorted({1, os.cpu_count() or 1}))
    ap.add_argument("--dir", default=None, help="directory to write in (default: a temp dir)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=a.dir or "/var/tmp") as d:
        run(a.mib, a.rounds, a.threads, d).report()


if __name__ == "__main__":
    main()
