"""The machine's measured ceilings: `ds bench peak`, the cache, and MFU's peak on a CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ds.monitor import ceiling, peak_cli
from ds.monitor.peak import peak_flops, peak_flops_source

DS = Path(sys.executable).parent / "ds"
TINY = ["--max-n", "64", "--mib", "1", "--repeat", "2", "--threads", "1"]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "peak.json"
    monkeypatch.setenv("DS_PEAK_CACHE", str(path))
    monkeypatch.delenv("DS_PEAK_TFLOPS", raising=False)
    monkeypatch.delenv("DS_PEAK_MEASURE", raising=False)
    return path


def _ds(args: list[str], cache: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, DS_PEAK_CACHE=str(cache))
    return subprocess.run(
        [str(DS), "bench", "peak", *args], capture_output=True, text=True, env=env, timeout=120
    )


@pytest.mark.timeout(150)
def test_bench_peak_json_measures_and_caches(cache: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    proc = _ds([*TINY, "--json", "--out", str(out)], cache)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    assert json.loads(out.read_text()) == result
    (entry,) = result["measured"]
    assert entry["threads"] == 1
    assert set(entry["flops"]) == {"fp32", "bf16", "fp16"}
    # Sane: positive, and below 100 TFLOP/s / 10 TB/s for one CPU thread.
    assert all(0 < f < 1e14 for f in entry["flops"].values()), entry
    assert all(n == 64 for n in entry["gemm_n"].values())
    assert 0 < entry["bandwidth_bytes_per_s"] < 1e13
    stored = json.loads(cache.read_text())[ceiling.cache_key(1)]
    assert stored["flops"] == entry["flops"] and stored["torch"] == torch.__version__
    assert result["cache"] == str(cache)


def test_bench_peak_table_and_bad_dtype(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert peak_cli.main([*TINY, "--dtypes", "fp32"]) == 0
    out = capsys.readouterr().out
    assert "fp32 GFLOP/s (n)" in out and "triad GB/s" in out
    assert "bf16" not in out and str(cache) in out
    assert peak_cli.main([*TINY, "--dtypes", "fp32,fp8"]) == 2
    err = capsys.readouterr().err
    assert "unknown dtype(s) ['fp8']" in err and "fp32, bf16, fp16" in err


def test_cpu_peak_reads_the_cache_and_the_override_wins(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads = torch.get_num_threads()
    entry = {"threads": threads, "flops": {"fp32": 3.5e10}, "gemm_n": {"fp32": 1024}}
    ceiling.store(entry)
    assert peak_flops("cpu", torch.float32) == 3.5e10
    assert peak_flops_source("cpu", torch.float32) == (3.5e10, "measured")
    monkeypatch.setenv("DS_PEAK_TFLOPS", "2")
    assert peak_flops_source("cpu", torch.float32) == (2e12, "DS_PEAK_TFLOPS")
    monkeypatch.setenv("DS_PEAK_TFLOPS", "fast")
    with pytest.raises(ValueError, match="DS_PEAK_TFLOPS='fast' is not a number"):
        peak_flops("cpu", torch.float32)
    monkeypatch.delenv("DS_PEAK_TFLOPS")
    monkeypatch.setenv("DS_PEAK_MEASURE", "0")
    assert peak_flops_source("cpu", torch.float32) == (None, "unknown")


def test_cpu_peak_measures_once_when_not_cached(cache: Path) -> None:
    assert not cache.exists()
    first = peak_flops("cpu", torch.float32)
    assert first is not None and first > 0
    stored = json.loads(cache.read_text())[ceiling.cache_key(torch.get_num_threads())]
    assert stored["flops"] == {"fp32": first}  # only the dtype asked for
    assert "bandwidth_bytes_per_s" not in stored
    assert peak_flops("cpu", torch.float32) == first  # from the cache, not measured again


def test_cache_keeps_the_highest_figure_per_thread_count(cache: Path) -> None:
    def entry(threads: int, fp32: float, bw: float) -> dict:
        return {"threads": threads, "flops": {"fp32": fp32}, "gemm_n": {"fp32": 512},
                "bandwidth_bytes_per_s": bw}  # fmt: skip

    ceiling.store(entry(1, 2e10, 5e9))
    ceiling.store(entry(1, 1e10, 7e9))  # a busy run: lower GEMM, higher bandwidth
    ceiling.store(entry(2, 4e10, 9e9))
    one, two = ceiling.cached(1), ceiling.cached(2)
    assert one is not None and two is not None
    assert one["flops"]["fp32"] == 2e10 and one["bandwidth_bytes_per_s"] == 7e9
    assert two["flops"]["fp32"] == 4e10
    cache.write_text("not json")  # a corrupt cache is measured again, then rewritten
    assert ceiling.cached(1) is None
    ceiling.store(entry(1, 1e10, 1e9))
    assert ceiling.cached(1)["flops"]["fp32"] == 1e10


def test_measure_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match="max_n = 8: must be >= 16"):
        ceiling.measure(1, ["fp32"], bandwidth=False, max_n=8)
    with pytest.raises(ValueError, match="mib = 0: must be >= 1"):
        ceiling.measure(1, [], bandwidth=True, mib=0)
    with pytest.raises(ValueError, match="threads = 0: must be >= 1"):
        ceiling.measure(0, ["fp32"], bandwidth=False)
