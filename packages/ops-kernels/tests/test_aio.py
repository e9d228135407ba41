"""Async block-wise file I/O: byte-exact round trips, O_DIRECT and buffered paths, real faults."""

from __future__ import annotations

import gc
import os
import random
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from ds.interfaces.errors import AsyncIOError, ConfigError, KernelError
from ds.interfaces.kernels import AsyncIOHandle as AsyncIOHandleProtocol
from ds.ops.aio import AsyncIOHandle


def _random_bytes(n: int, seed: int) -> torch.Tensor:
    return torch.randint(
        0, 256, (n,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed)
    )


def _mount(tmp_path: Path, fstype: str, options: str) -> Path:
    target = tmp_path / f"mnt-{fstype}"
    target.mkdir()
    cmd = ["mount", "-t", fstype, "-o", options, fstype, str(target)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"cannot run mount ({e}); this test needs permission to mount {fstype}")
    if proc.returncode != 0:
        pytest.skip(f"mounting {fstype} is not permitted here: {proc.stderr.strip()}")
    return target


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    target = _mount(tmp_path, "tmpfs", "size=64k")
    yield target
    subprocess.run(["umount", str(target)], check=False, timeout=20)


@pytest.fixture
def ramfs(tmp_path: Path) -> Iterator[Path]:
    # ramfs has no direct-I/O support: open(O_DIRECT) fails with EINVAL.
    target = _mount(tmp_path, "ramfs", "mode=755")
    yield target
    subprocess.run(["umount", str(target)], check=False, timeout=20)


def test_handle_satisfies_the_protocol() -> None:
    with AsyncIOHandle() as h:
        assert isinstance(h, AsyncIOHandleProtocol)


@pytest.mark.parametrize(
    "threads,single_submit,overlap,block_size",
    [
        (1, False, True, 1 << 20),
        (3, False, True, 8192),
        (2, True, True, 5000),
        (2, False, False, 4096),
    ],
)
@pytest.mark.parametrize("direct", [True, False])
def test_round_trip_random_offsets_and_sizes(
    tmp_path: Path, threads: int, single_submit: bool, overlap: bool, block_size: int, direct: bool
) -> None:
    rng = random.Random(threads * 7 + block_size)
    path = str(tmp_path / "data.bin")
    model = bytearray()
    with AsyncIOHandle(
        block_size=block_size,
        queue_depth=3,
        intra_op_parallelism=threads,
        single_submit=single_submit,
        overlap_events=overlap,
        use_o_direct=direct,
    ) as h:
        submitted = 0
        batch: list[tuple[int, int]] = []
        for i in range(12):
            size = rng.choice([1, 7, 4096, 4096 * 5, 100_003, 3 * 65536 + 11])
            offset = rng.choice([0, 4096 * rng.randrange(0, 40), rng.randrange(0, 300_000)])
            buf = h.new_pinned_buffer(size) if i % 2 == 0 else torch.empty(size, dtype=torch.uint8)
            buf.copy_(_random_bytes(size, i))
            # concurrent writes to overlapping regions land in no defined order: wait first
            if any(offset < hi and lo < offset + size for lo, hi in batch):
                assert h.wait() == submitted
                submitted, batch = 0, []
            h.async_pwrite(buf, path, offset)
            batch.append((offset, offset + size))
            submitted += 1
            # the handle keeps the buffer alive and untouched by us until wait()
            if len(model) < offset + size:
                model.extend(b"\0" * (offset + size - len(model)))
            model[offset : offset + size] = bytes(buf.numpy())
            if i % 5 == 4:
                assert h.wait() == submitted
                submitted, batch = 0, []
        assert h.wait() == submitted
        assert Path(path).read_bytes() == bytes(model)
        # read back random windows, sync and async
        for j in range(10):
            size = rng.randrange(1, 200_000)
            offset = rng.randrange(0, len(model) - size)
            out = h.new_pinned_buffer(size) if j % 2 else torch.empty(size, dtype=torch.uint8)
            if j % 3:
                assert h.sync_pread(out, path, offset) == size
            else:
                h.async_pread(out, path, offset)
                assert h.wait() == 1
            assert bytes(out.numpy()) == bytes(model[offset : offset + size])
        if not direct:
            assert h.direct_bytes == 0
        else:
            assert h.direct_bytes > 0  # aligned pinned buffers at 4 KiB offsets went direct


def test_o_direct_path_for_aligned_buffers_and_offsets(tmp_path: Path) -> None:
    path = str(tmp_path / "aligned.bin")
    with AsyncIOHandle(block_size=65536, intra_op_parallelism=2) as h:
        buf = h.new_pinned_buffer(1 << 20)
        assert buf.data_ptr() % 4096 == 0
        buf.copy_(_random_bytes(1 << 20, 1))
        assert h.sync_pwrite(buf, path, 8192) == 1 << 20
        assert h.direct_bytes == 1 << 20
        back = h.new_pinned_buffer(1 << 20)
        assert h.sync_pread(back, path, 8192) == 1 << 20
        assert torch.equal(buf, back) and h.direct_bytes == 2 << 20
        # unaligned offset: same bytes, buffered path
        before = h.direct_bytes
        assert h.sync_pwrite(buf, path, 8193) == 1 << 20
        assert h.direct_bytes == before
        assert Path(path).read_bytes()[8193:] == bytes(buf.numpy())
        # aligned start with an unaligned tail: the aligned part direct, the tail buffered
        odd = h.new_pinned_buffer(3 * 4096 + 5)
        odd.copy_(_random_bytes(odd.numel(), 2))
        before = h.direct_bytes
        h.sync_pwrite(odd, path, 0)
        assert h.direct_bytes - before == 3 * 4096
        assert Path(path).read_bytes()[: odd.numel()] == bytes(odd.numpy())


def test_filesystem_without_o_direct_falls_back_to_buffered(ramfs: Path) -> None:
    path = str(ramfs / "f.bin")
    with AsyncIOHandle(block_size=8192, intra_op_parallelism=2, use_o_direct=True) as h:
        buf = h.new_pinned_buffer(100_000)
        buf.copy_(_random_bytes(100_000, 3))
        assert h.sync_pwrite(buf, path, 4096) == 100_000
        back = h.new_pinned_buffer(100_000)
        h.async_pread(back, path, 4096)
        assert h.wait() == 1
        assert torch.equal(buf, back)
        assert h.direct_bytes == 0 and h.total_bytes == 200_000


def test_enospc_on_dev_full_names_the_file() -> None:
    with AsyncIOHandle(block_size=4096, intra_op_parallelism=2) as h:
        h.async_pwrite(torch.ones(10_000), "/dev/full", 0)
        with pytest.raises(AsyncIOError, match="/dev/full") as exc:
            h.wait()
        assert exc.value.errno == 28 and exc.value.filename == "/dev/full"
        with pytest.raises(AsyncIOError, match="No space left"):
            h.sync_pwrite(torch.ones(10), "/dev/full")


def test_enospc_on_a_tiny_tmpfs(tiny_tmpfs: Path) -> None:
    path = str(tiny_tmpfs / "big.bin")
    with AsyncIOHandle(block_size=16384, intra_op_parallelism=2) as h:
        small = _random_bytes(8192, 4)
        assert h.sync_pwrite(small, str(tiny_tmpfs / "small.bin"), 0) == 8192
        h.async_pwrite(_random_bytes(1 << 20, 5), path, 0)  # 1 MiB into what is left of 64 KiB
        with pytest.raises(AsyncIOError, match=r"big\.bin") as exc:
            h.wait()
        assert exc.value.errno == 28
        # the failure is reported once; the handle keeps working for what fits
        assert h.wait() == 0
        back = torch.empty(8192, dtype=torch.uint8)
        assert h.sync_pread(back, str(tiny_tmpfs / "small.bin")) == 8192
        assert torch.equal(back, small)


def test_short_reads_and_missing_files_raise_with_the_path(tmp_path: Path) -> None:
    path = tmp_path / "short.bin"
    path.write_bytes(b"x" * 1000)
    with AsyncIOHandle() as h:
        buf = torch.empty(2000, dtype=torch.uint8)
        with pytest.raises(AsyncIOError, match="short read") as exc:
            h.sync_pread(buf, str(path), 0)
        assert exc.value.filename == str(path)
        h.async_pread(buf[:10], str(path), 995)
        with pytest.raises(AsyncIOError, match=r"short\.bin"):
            h.wait()
        with pytest.raises(AsyncIOError) as missing:
            h.sync_pread(buf, str(tmp_path / "nope.bin"))
        assert missing.value.errno == 2 and "nope.bin" in str(missing.value)
        with pytest.raises(AsyncIOError) as isdir:
            h.sync_pwrite(buf, str(tmp_path))
        assert isdir.value.errno == 21


def test_concurrent_handles(tmp_path: Path) -> None:
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            with AsyncIOHandle(block_size=4096 * (k + 1), intra_op_parallelism=2) as h:
                data = _random_bytes(300_000 + k, 10 + k)
                path = str(tmp_path / f"h{k}.bin")
                for part in range(3):  # three async writes of thirds into one file
                    lo, hi = part * 100_000, (part + 1) * 100_000 + (k if part == 2 else 0)
                    h.async_pwrite(data[lo:hi], path, lo)
                assert h.wait() == 3
                back = torch.empty_like(data)
                assert h.sync_pread(back, path) == data.numel()
                assert torch.equal(back, data)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors


def test_many_ops_beyond_queue_depth_and_buffer_lifetime(tmp_path: Path) -> None:
    path = str(tmp_path / "q.bin")
    with AsyncIOHandle(
        block_size=4096, queue_depth=2, intra_op_parallelism=2, single_submit=True
    ) as h:
        for i in range(20):  # temporaries dropped at once: the handle must keep them alive
            h.async_pwrite(torch.full((5000,), i, dtype=torch.uint8), path, i * 5000)
        gc.collect()
        assert h.wait() == 20
    data = Path(path).read_bytes()
    assert all(data[i * 5000 : (i + 1) * 5000] == bytes([i]) * 5000 for i in range(20))


def test_typed_buffers_round_trip(tmp_path: Path) -> None:
    path = str(tmp_path / "typed.bin")
    x = torch.randn(1000, dtype=torch.bfloat16)
    with AsyncIOHandle() as h:
        assert h.sync_pwrite(x, path, 0) == 2000
        y = torch.empty_like(x)
        h.sync_pread(y, path, 0)
        assert torch.equal(x, y)
        pinned = h.new_pinned_buffer(4000).view(torch.float32)
        pinned.copy_(torch.arange(1000, dtype=torch.float32))
        h.sync_pwrite(pinned, path, 4096)
        assert torch.equal(
            torch.frombuffer(bytearray(Path(path).read_bytes()[4096:]), dtype=torch.float32),
            torch.arange(1000, dtype=torch.float32),
        )


def test_pinned_buffer_pool_alignment_reuse_and_misuse() -> None:
    with AsyncIOHandle() as h:
        a = h.new_pinned_buffer(10_000)
        assert a.dtype == torch.uint8 and a.numel() == 10_000 and a.data_ptr() % 4096 == 0
        ptr = a.data_ptr()
        h.free_pinned_buffer(a)
        b = h.new_pinned_buffer(9_000)  # same rounded size: the freed buffer comes back
        assert b.data_ptr() == ptr
        with pytest.raises(KernelError, match="did not lend"):
            h.free_pinned_buffer(torch.empty(10))
        h.free_pinned_buffer(b)
        with pytest.raises(KernelError, match="already"):
            h.free_pinned_buffer(b)
        with pytest.raises(ConfigError, match="num_bytes"):
            h.new_pinned_buffer(0)


def test_bad_arguments(tmp_path: Path) -> None:
    for kw in ({"block_size": 0}, {"queue_depth": -1}, {"intra_op_parallelism": 0}):
        with pytest.raises(ConfigError, match="must be a positive int"):
            AsyncIOHandle(**kw)  # type: ignore[arg-type]
    h = AsyncIOHandle()
    path = str(tmp_path / "x.bin")
    with pytest.raises(ConfigError, match="offset"):
        h.sync_pwrite(torch.ones(4), path, -1)
    with pytest.raises(KernelError, match="contiguous"):
        h.sync_pwrite(torch.ones(4, 4).t(), path)
    with pytest.raises(KernelError, match=r"torch\.Tensor"):
        h.async_pwrite(b"abc", path)  # type: ignore[arg-type]
    with pytest.raises(KernelError, match="CPU"):
        h.sync_pwrite(torch.ones(4, device="meta"), path)
    h.close()
    with pytest.raises(KernelError, match="closed"):
        h.sync_pwrite(torch.ones(4), path)
    assert h.wait() == 0
    assert not os.path.exists(path)


_EFBIG_SCRIPT = """
import resource, sys, torch
from ds.interfaces.errors import AsyncIOError
from ds.ops.aio import AsyncIOHandle
resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))  # Python ignores SIGXFSZ: EFBIG
with AsyncIOHandle(block_size=8192, intra_op_parallelism=2) as h:
    h.async_pwrite(torch.ones(1 << 18), sys.argv[1], 0)  # 1 MiB past a 64 KiB limit
    try:
        h.wait()
    except AsyncIOError as e:
        print(e.errno, e.filename)
        raise SystemExit(0)
raise SystemExit("no error")
"""


@pytest.mark.timeout(120)
def test_file_size_limit_fault_is_reported(tmp_path: Path) -> None:
    # A real fault that needs no privileges: the process's RLIMIT_FSIZE (in a child process).
    import sys

    path = str(tmp_path / "limited.bin")
    proc = subprocess.run(
        [sys.executable, "-c", _EFBIG_SCRIPT, path], capture_output=True, text=True, timeout=100
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["27", path]  # EFBIG
    assert os.path.getsize(path) <= 65536


_HELD_AT_EXIT = """
import sys, threading, torch
from ds.ops.aio import AsyncIOHandle
h = AsyncIOHandle()
h.async_pwrite(torch.arange(1 << 20, dtype=torch.float32), sys.argv[1])
# A daemon thread (a prefetcher, a monitor) still holds the handle when the interpreter ends.
threading.Thread(target=lambda handle=h: threading.Event().wait(), daemon=True).start()
del h
"""


def test_a_handle_still_held_at_exit_finishes_its_writes_and_is_released(tmp_path: Path) -> None:
    import sys

    out = tmp_path / "held.bin"
    proc = subprocess.run(
        [sys.executable, "-c", _HELD_AT_EXIT, str(out)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "leaked" not in proc.stderr, proc.stderr  # nanobind's report of a live native handle
    assert out.stat().st_size == 4 << 20
    assert torch.equal(torch.from_file(str(out), size=1 << 20), torch.arange(1 << 20).float())
