"""Progress of long saves: silent for short ones, a line per tenth off a terminal, a bar on one."""

from __future__ import annotations

import io

import torch

from ds.checkpoint._progress import Progress
from ds.checkpoint.engine import ShardedCheckpointEngine
from ds.checkpoint.sharding import full_requests, shard_state


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _state(n: int = 20):
    g = torch.Generator().manual_seed(0)
    ts = {f"w{i}": torch.randn(256, 257, generator=g) for i in range(n)}  # ~257 KiB each
    return ts, shard_state(ts, 0, 1)


def test_silent_until_long_then_a_line_per_tenth() -> None:
    clock, out = _Clock(), io.StringIO()
    p = Progress("checkpoint save t", 100 * 2**20, "B", after_s=5.0, stream=out, clock=clock)
    for _ in range(30):  # 30% in the first 3 s: nothing yet
        clock.t += 0.1
        p(2**20)
    assert out.getvalue() == ""
    clock.t = 6.0
    for _ in range(70):
        p(2**20)
    lines = out.getvalue().splitlines()
    # The first line once it is long (at 31%), then one per tenth crossed, the last at 100%.
    assert lines[0].startswith("checkpoint save t: 31.0/100.0 MiB (31%")
    assert len(lines) == 8 and lines[-1].startswith("checkpoint save t: 100.0/100.0 MiB (100%")
    assert "MiB/s)" in lines[-1]


def test_short_work_prints_nothing() -> None:
    clock, out = _Clock(), io.StringIO()
    p = Progress("x", 10, after_s=5.0, stream=out, clock=clock)
    for _ in range(10):
        clock.t += 0.1
        p()
    assert out.getvalue() == ""


def test_a_terminal_gets_a_bar() -> None:
    out = _Tty()
    p = Progress("checkpoint save t", 4 * 2**20, "B", stream=out)
    for _ in range(4):
        p(2**20)
    text = out.getvalue()
    assert "checkpoint save t" in text and "100%" in text and "\n" not in text.strip("\n")


def test_a_save_reports_its_bytes_and_loads_back(tmp_path, capsys) -> None:
    ts, state = _state()
    eng = ShardedCheckpointEngine(progress_after_s=0.0)
    eng.save(str(tmp_path), "t", state)
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("checkpoint save t:")]
    total = sum(t.numel() * 4 for t in ts.values()) / 2**20
    assert 2 <= len(lines) <= 10, lines
    assert lines[-1].startswith(f"checkpoint save t: {total:.1f}/{total:.1f} MiB (100%"), lines
    out = eng.load(str(tmp_path), "t", full_requests(eng.metadata(str(tmp_path), "t").values()))
    assert all(torch.equal(out.tensors[k].local, v.reshape(-1)) for k, v in ts.items())


def test_a_quick_save_with_the_default_threshold_is_silent(tmp_path, capsys) -> None:
    _, state = _state(2)
    ShardedCheckpointEngine().save(str(tmp_path), "t", state)
    ShardedCheckpointEngine(progress_after_s=None).save(str(tmp_path), "u", state)
    assert "checkpoint save" not in capsys.readouterr().err
