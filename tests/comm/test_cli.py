"""``ds bench comm`` (entry point ds.cli/bench.comm) spawning its own gloo ranks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ds.comm.cli import parse_size, sizes_between
from ds.interfaces.registry import get

from .conftest import _base_env


def test_verb_is_registered():
    from ds.comm.cli import main

    assert get("ds.cli", "bench.comm") is main


@pytest.mark.parametrize(("text", "n"), [("1K", 1024), ("256M", 256 << 20), ("4096", 4096)])
def test_parse_size(text, n):
    assert parse_size(text) == n


def test_default_sizes_span_1k_to_256m():
    sizes = sizes_between(parse_size("1K"), parse_size("256MiB"), 4)
    assert sizes[0] == 1024 and sizes[-1] == 256 << 20 and len(sizes) == 10


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_bench_comm_spawns_ranks_and_compares_with_torch(tmp_path):
    out = tmp_path / "rows.json"
    argv = ["--ops", "all_reduce,all_gather,reduce_scatter,all_to_all,broadcast"]
    argv += ["--max-size", "4K", "--trials", "2", "--nproc", "3", "--compare-torch"]
    argv += ["--json", str(out)]
    code = "import sys; from ds.interfaces.registry import get; "
    code += "sys.exit(get('ds.cli', 'bench.comm')(sys.argv[1:]))"
    proc = subprocess.run(
        [sys.executable, "-c", code, *argv],
        env=_base_env(),
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert proc.returncode == 0, proc.stderr
    assert "world 3, backend gloo" in proc.stdout
    assert "ds/torch" in proc.stdout
    rows = json.loads(out.read_text())
    assert {(r["op"], r["bytes"]) for r in rows} == {
        (op, n)
        for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
        for n in (1024, 4096)
    }
    for r in rows:
        assert r["latency_s"] > 0 and r["torch_latency_s"] > 0
        assert r["algbw_gbps"] == pytest.approx(r["bytes"] / r["latency_s"] / 1e9)
        factor = {"all_reduce": 4 / 3, "broadcast": 1.0}.get(r["op"], 2 / 3)
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * factor)


def test_bad_arguments_exit_2(capsys):
    from ds.comm.cli import main

    assert main(["--min-size", "1M", "--max-size", "1K"]) == 2
