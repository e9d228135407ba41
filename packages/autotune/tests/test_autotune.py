"""``ds autotune`` end to end on this machine: real 2-rank trials of an unchanged script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ds.autotune import tune
from ds.interfaces.errors import ConfigError

HERE = Path(__file__).resolve().parent
TINY = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
}
BASE = {
    "train_batch_size": 8,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
    "zero_optimization": {"stage": 0},
    "steps_per_print": 1000,
}


def _setup(tmp_path: Path) -> tuple[Path, Path]:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TINY))
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps(BASE))
    return model, cfg


def _autotune(tmp_path: Path, *opts: str, steps: int = 1000) -> subprocess.CompletedProcess[str]:
    model, cfg = _setup(tmp_path)
    cmd = [sys.executable, "-m", "ds.launcher", "autotune", "--config", str(cfg), "--nproc", "2"]
    opts = tuple(str(model) if o == "MODEL" else o for o in opts)
    cmd += [*opts, "--out", str(tmp_path / "out"), str(HERE / "train_tiny.py")]
    cmd += ["--model", str(model), "--deepspeed_config", str(cfg), "--steps", str(steps)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=560)


def _trials(test: Any) -> Any:
    """The marks of a test that runs real 2-rank trials."""
    return pytest.mark.slow(pytest.mark.multiprocess(pytest.mark.timeout(600)(test)))


def test_search_space_keeps_the_global_batch() -> None:
    pts, skipped = tune.points(BASE, 2, [0, 2], [1, 2, 3, 4], ["none", "cpu"])
    assert {(p.micro_batch, p.gradient_accumulation_steps) for p in pts} == {(1, 4), (2, 2), (4, 1)}
    # stage 0 has no optimizer offload (it needs stage >= 1)
    assert len(pts) == 3 + 3 * 2 and len(skipped) == 1 and "micro=3" in skipped[0]
    assert not [p for p in pts if p.stage == 0 and p.offload == "cpu"]
    for p in pts:
        c = p.config
        assert c["train_micro_batch_size_per_gpu"] * c["gradient_accumulation_steps"] * 2 == 8
        assert c["zero_optimization"]["stage"] == p.stage
        assert ("offload_optimizer" in c["zero_optimization"]) == (p.offload == "cpu")


def test_bad_search_spaces_are_one_line() -> None:
    with pytest.raises(ConfigError, match="choose from 0, 1, 2, 3"):
        tune.points(BASE, 2, [4], [1], ["none"])
    with pytest.raises(ConfigError, match="offload 'nvme'"):
        tune.points(BASE, 2, [0], [1], ["nvme"])
    with pytest.raises(ConfigError, match="neither train_batch_size"):
        tune.points({"optimizer": {}}, 2, [0], [1], ["none"])


@_trials
def test_autotune_picks_the_fastest_point_it_timed(tmp_path: Path) -> None:
    # Two points (one per stage) make a choice; each more point is one more 2-rank trial.
    proc = _autotune(tmp_path, "--stages", "0,2", "--micro", "2", "--offload", "none",
                     "--model", "MODEL", "--seq-len", "32", "--memory-limit", "64GiB")  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    rows = json.loads((tmp_path / "out" / "results.json").read_text())
    timed = [r for r in rows if r["status"] == "timed"]
    assert len(timed) == 2, out[-4000:]
    assert all(r["estimate_bytes"] > 0 for r in rows)  # each point estimated before its trial
    best = max(timed, key=lambda r: r["samples_per_s"])
    assert rows[0] == best and rows[0]["why"] == "best measured samples/s"
    assert all("slower" in r["why"] for r in rows[1:])
    chosen = json.loads((tmp_path / "out" / "best_config.json").read_text())
    assert chosen["zero_optimization"]["stage"] == best["stage"]
    assert chosen["train_micro_batch_size_per_gpu"] == best["micro_batch"]
    assert "samples/s" in out and "best:" in out


@_trials
def test_pruned_points_are_not_run_and_no_fit_names_the_smallest(tmp_path: Path) -> None:
    proc = _autotune(tmp_path, "--stages", "0,3", "--micro", "4", "--offload", "none",
                     "--model", "MODEL", "--seq-len", "32", "--memory-limit", "1KiB")  # fmt: skip
    assert proc.returncode == 2
    err = proc.stderr.strip().splitlines()[-1]
    assert err.startswith("error: no point fits --memory-limit") and "the smallest needs" in err
    assert "stage=3" in err  # stage 3 shards the most
    assert not list((tmp_path / "out").glob("trial*.json"))


@_trials
def test_a_script_that_stops_early_is_reported(tmp_path: Path) -> None:
    proc = _autotune(tmp_path, "--stages", "0", "--micro", "4", "--offload", "none", steps=3)
    assert proc.returncode == 1
    rows = json.loads((tmp_path / "out" / "results.json").read_text())
    assert rows[0]["status"] == "failed" and "ended before step 8" in rows[0]["why"]
