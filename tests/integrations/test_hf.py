"""Transformers Trainer on the ds engine: 2-rank runs (started by ``ds run``) of a tiny random Llama
under ZeRO-2 and ZeRO-3 give the single-process stock Trainer's losses, and the saved directories
reload with ``from_pretrained`` to the same logits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "hf_trainer_llama.py"
DS = Path(sys.executable).with_name("ds")
# fp32 everywhere; sharded reductions add in a different order than one process does.
RTOL = 1e-4

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]


def run(tmp: Path, name: str, *args: str, nproc: int = 0) -> dict[str, Any]:
    out = tmp / name
    losses = tmp / f"{name}.json"
    script = [str(EXAMPLE), "--output-dir", str(out), "--losses", str(losses), *args]
    cmd = [str(DS), "run", "--nproc", str(nproc), *script] if nproc else [sys.executable, *script]
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    report: dict[str, Any] = json.loads(losses.read_text())
    report["model_dir"] = str(out / "model")
    return report


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run(tmp_path_factory.mktemp("hf_plain"), "plain", "--plain")


def logits(model_dir: str) -> torch.Tensor:
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(model_dir)
    model.eval()
    ids = (torch.arange(32).reshape(2, 16) * 5) % 96
    with torch.no_grad():
        out: torch.Tensor = model(input_ids=ids).logits
    return out


@pytest.mark.timeout(600)
def test_two_rank_zero2_trainer_matches_single_process(
    reference: dict[str, Any], tmp_path: Path
) -> None:
    got = run(tmp_path, "zero2", "--stage", "2", nproc=2)
    check_trained(reference, got, 2)


def check_trained(reference: dict[str, Any], got: dict[str, Any], stage: int) -> None:
    assert got["engine"] == "ZeroEngine" and got["zero_stage"] == stage
    assert got["world_size"] == 2
    ref = reference["losses"]
    assert len(ref) == 20 and len(got["losses"]) == 20
    assert got["losses"] == pytest.approx(ref, rel=RTOL)
    assert ref[-1] < ref[0] - 0.3  # the run learned something: the comparison is not vacuous

    # The saved directory is a normal Transformers checkpoint with the trained weights.
    assert (Path(got["model_dir"]) / "config.json").exists()
    want = logits(reference["model_dir"])
    have = logits(got["model_dir"])
    torch.testing.assert_close(have, want, rtol=1e-3, atol=1e-3)
    # ...and not the untrained model's.
    from transformers import LlamaConfig, LlamaForCausalLM

    assert not torch.allclose(
        have,
        LlamaForCausalLM(LlamaConfig.from_pretrained(got["model_dir"]))(
            input_ids=(torch.arange(32).reshape(2, 16) * 5) % 96
        ).logits.detach(),
        atol=1e-2,
    )


@pytest.mark.timeout(300)
def test_from_pretrained_zero3_partitions_and_loads(tmp_path: Path) -> None:
    sys.path.insert(0, str(EXAMPLE.parent))
    from hf_trainer_llama import tiny_llama

    model_dir = tmp_path / "tiny"
    tiny_llama().save_pretrained(model_dir)
    out = tmp_path / "zero3.json"
    worker = Path(__file__).with_name("hf_zero3_worker.py")
    cmd = [str(DS), "run", "--nproc", "2", str(worker), str(model_dir), str(out)]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    got = json.loads(out.read_text())
    assert got["partitioned"] == got["params"] > 0
    # Each rank keeps about half of every tensor and nothing whole stays visible.
    assert got["local_numel"] <= got["full_numel"] // 2 + got["params"]
    assert got["visible_numel"] == 0
    assert got["max_abs_diff"] == 0.0


@pytest.mark.timeout(600)
def test_resume_from_checkpoint_zero3(reference: dict[str, Any], tmp_path: Path) -> None:
    """A ZeRO-3 run matches the single-process reference, and its checkpoint-10 (HF files + the
    engine's shards) resumes to the same last 10 losses."""
    # The first run is also the ZeRO-3 parity case, with gradient accumulation (2 micro-batches).
    zero3 = ("--stage", "3", "--accumulate", "2")
    first = run(tmp_path, "first", *zero3, "--save-steps", "10", nproc=2)
    check_trained(reference, first, 3)
    ckpt = tmp_path / "first" / "checkpoint-10"
    assert (ckpt / "ds_engine" / "latest").exists() and (ckpt / "model.safetensors").exists()
    resumed = run(tmp_path, "resumed", *zero3, "--resume", str(ckpt), nproc=2)
    assert resumed["losses"] == pytest.approx(reference["losses"][10:], rel=RTOL)
