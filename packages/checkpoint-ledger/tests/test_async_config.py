"""Asynchronous saves (byte-identical to synchronous ones, errors surface), writers and config."""

from __future__ import annotations

import filecmp
import os

import pytest
import torch

from ds.checkpoint._writers import AioWriter, PythonWriter, make_writer
from ds.checkpoint.config import build_engine, parse_checkpoint_config
from ds.checkpoint.engine import ShardedCheckpointEngine
from ds.checkpoint.sharding import full_requests, shard_state
from ds.interfaces.errors import CheckpointError, ConfigError


def _state(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ts = {f"layer{i}.w": torch.randn(64, 33, generator=g) for i in range(4)}
    ts["emb"] = torch.randn(100, 8, generator=g).to(torch.bfloat16)
    state = shard_state(ts, 0, 1)
    state.objects = {"step": 7, "lr": [0.1, 0.01]}
    state.rank_objects = {"rng": torch.Generator().manual_seed(5).get_state()}
    return ts, state


def _same_tree(a: str, b: str) -> None:
    names = sorted(os.listdir(a))
    assert names == sorted(os.listdir(b))
    for n in names:
        assert filecmp.cmp(os.path.join(a, n), os.path.join(b, n), shallow=False), n


def test_async_save_equals_sync_save_byte_for_byte(tmp_path) -> None:
    _, state = _state()
    eng = ShardedCheckpointEngine()
    eng.save(str(tmp_path / "sync"), "t", state)
    handle = eng.save(str(tmp_path / "async"), "t", state, async_save=True)
    handle.wait()
    assert handle.done()
    _same_tree(str(tmp_path / "sync" / "t"), str(tmp_path / "async" / "t"))


def test_async_save_snapshots_state_before_training_continues(tmp_path) -> None:
    ts, state = _state()
    expected = {k: v.clone() for k, v in ts.items()}
    eng = ShardedCheckpointEngine()
    eng.save(str(tmp_path), "t", state, async_save=True)
    for t in ts.values():  # the next training step modifies parameters in place
        t.add_(1)
    eng.wait()
    metas = eng.metadata(str(tmp_path), "t")
    out = eng.load(str(tmp_path), "t", full_requests(metas.values()))
    for k, v in expected.items():
        assert torch.equal(out.tensors[k].local, v.reshape(-1))


def test_next_save_waits_for_the_previous_one(tmp_path) -> None:
    eng = ShardedCheckpointEngine(async_save=True)
    for i in range(3):
        _, state = _state(i)
        eng.save(str(tmp_path), f"s{i}", state)
    eng.wait()
    assert eng.latest_tag(str(tmp_path)) == "s2"
    assert sorted(os.listdir(tmp_path)) == ["latest", "s0", "s1", "s2"]
    for i in range(3):
        assert eng.verify(str(tmp_path), f"s{i}") == []


class _FailingWriter(PythonWriter):
    """A writer whose disk fills up: a real OSError from a real write path."""

    def write(self, path, pieces, checksum):  # type: ignore[no-untyped-def]
        raise OSError(28, "No space left on device", path)


def test_background_error_surfaces_on_wait_and_keeps_previous(tmp_path) -> None:
    _, state = _state()
    good = ShardedCheckpointEngine()
    good.save(str(tmp_path), "ok", state)
    eng = ShardedCheckpointEngine(writer=_FailingWriter())
    eng.save(str(tmp_path), "bad", state, async_save=True)
    with pytest.raises(CheckpointError, match="No space left on device"):
        eng.wait()
    eng.wait()  # raised once
    assert eng.latest_tag(str(tmp_path)) == "ok"
    assert not os.path.exists(tmp_path / "bad")
    assert not os.path.exists(tmp_path / ".tmp-bad")
    # The error also surfaces on the next save rather than being lost.
    eng.save(str(tmp_path), "bad2", state, async_save=True)
    with pytest.raises(CheckpointError, match="bad2"):
        eng.save(str(tmp_path), "bad3", state)


def test_config_section_and_errors() -> None:
    cfg = parse_checkpoint_config({"writer": "python", "async": True})
    assert cfg.async_save and cfg.writer == "python" and cfg.checksum
    with pytest.raises(ConfigError, match=r"checkpoint\.writer"):
        parse_checkpoint_config({"writer": "fast"})
    with pytest.raises(ConfigError, match="valid keys: writer, async, checksum"):
        parse_checkpoint_config({"asynch": True})
    eng = build_engine({"async": True})
    assert isinstance(eng, ShardedCheckpointEngine)
    with pytest.raises(ConfigError, match="ds-ops-kernels"):
        make_writer("aio", kernels=object())
    with pytest.raises(ConfigError, match="'python' or 'aio'"):
        make_writer("other")


def _aio_provider():
    from ds.interfaces import registry

    try:
        found = registry.get(registry.KERNELS, "cpu")
        provider = found() if isinstance(found, type) else found
        provider.aio_handle(use_o_direct=False).close()
    except Exception as exc:
        pytest.skip(f"ds-ops-kernels async I/O handle unavailable here: {exc}")
    return provider


def test_aio_writer_matches_python_writer(tmp_path) -> None:
    provider = _aio_provider()
    _, state = _state()
    ShardedCheckpointEngine().save(str(tmp_path / "py"), "t", state)
    ShardedCheckpointEngine(writer=AioWriter(provider)).save(str(tmp_path / "aio"), "t", state)
    _same_tree(str(tmp_path / "py" / "t"), str(tmp_path / "aio" / "t"))


def test_ledger_and_gate_sections(tmp_path) -> None:
    from ds.checkpoint.config import build_gate, build_ledger, parse_gate_config
    from ds.interfaces.telemetry import EventBus, StepMetrics

    led = build_ledger({"path": str(tmp_path / "run.jsonl")})
    bus = EventBus()
    gate = build_gate(
        {"p99_step_latency_s_max": 0.1, "window": 5, "warmup_steps": 0}, ledger=led, events=bus
    )
    bus.publish(StepMetrics(step=0, loss=1.0, lr=0.1, step_time_s=0.2))
    assert not gate.report().passed
    led.close()
    assert (tmp_path / "run.jsonl").read_text().count("readiness_assessment") == 1
    with pytest.raises(ConfigError, match=r"gate\.window"):
        parse_gate_config({"window": 0})
    with pytest.raises(ConfigError, match="valid keys"):
        parse_gate_config({"p99": 1})
