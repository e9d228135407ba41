"""The CPU-checkable parts of the real-GPU check (tools/gpu/check.sh): its arguments, the model
it builds, and the whole driver at tiny size on the CPU (gloo), where the GPU cannot be had."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "tools" / "gpu"
sys.path.insert(0, str(GPU))

import check  # noqa: E402
import models  # noqa: E402


def test_defaults_cover_every_section_stage_and_system() -> None:
    args = check.parse_args([])
    assert args.sections == ["parity", "kernels", "inference", "bench"]
    assert args.stages == [0, 1, 2, 3] and args.size == "1b" and args.device == "cuda"
    assert args.systems == ["ds", "torch DDP", "torch FSDP2"]
    assert check.parse_args(["--sections", "bench,parity", "--stages", "3"]).stages == [3]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sections", "parity,train"], "unknown section(s) train"),
        (["--stages", "1,4"], "are not ZeRO stages"),
        (["--stages", "a"], "not a comma-separated list of integers"),
        (["--steps", "0"], "must be >= 1"),
        (["--systems", "ds,megatron"], "unknown ['megatron']"),
        (["--device", "cpu"], "kernels needs --device cuda"),
        (["--size", "7b"], "invalid choice"),
    ],
)
def test_bad_arguments_are_usage_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        check.parse_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_tiny_model_build_and_the_1b_shape() -> None:
    tiny = models.build_llama("tiny")
    assert sum(p.numel() for p in tiny.parameters()) == models.param_count("tiny")
    ids = torch.randint(0, 512, (2, 16))
    assert tiny(input_ids=ids, labels=ids).loss.isfinite()
    import transformers

    with torch.device("meta"):  # the real 1B module, without its memory
        big = transformers.LlamaForCausalLM(models.llama_config("1b"))
    n = sum(p.numel() for p in big.parameters())
    assert n == models.param_count("1b") and 1.0e9 < n < 1.2e9
    # 6 FLOPs per matmul weight per token plus attention: about 6.6e9 at 1B and 2048 tokens.
    assert 6.0 * 1.0e9 < models.flops_per_token("1b", 2048) < 7.5e9
    assert models.peak_tflops("NVIDIA H200", None) == 989.4
    assert models.peak_tflops("Some GPU", None) is None


def test_check_sh_refuses_to_run_without_a_gpu() -> None:
    env = {**os.environ, "PYTHON": sys.executable}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    proc = subprocess.run(
        [str(GPU / "check.sh"), "--sections", "inference"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the check would really run")
    assert proc.returncode == 1
    assert "no CUDA device is visible (pass --device cpu)" in proc.stderr
    usage = subprocess.run(
        [str(GPU / "check.sh"), "--help"], capture_output=True, text=True, env=env, timeout=120
    )
    assert usage.returncode == 0 and "--sections" in usage.stdout


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_driver_end_to_end_on_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "check.json"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    proc = subprocess.run(
        [
            sys.executable, str(GPU / "check.py"), "--device", "cpu", "--size", "tiny",
            "--sections", "parity,bench", "--stages", "0,3", "--parity-steps", "2",
            "--batch", "2", "--seq", "16", "--steps", "1", "--warmup", "1", "--out", str(out),
        ],
        capture_output=True, text=True, env=env, timeout=280,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    parity = report["sections"]["parity"]
    assert [(r["stage"], r["offload"]) for r in parity] == [(0, "none"), (3, "none"), (3, "cpu")]
    assert all(r["ok"] and r["max_abs_diff"] <= 1e-5 for r in parity)
    bench = report["sections"]["bench"]
    assert [r["system"] for r in bench] == ["ds ZeRO-2", "torch DDP", "torch FSDP2"]
    assert all(r["step_s"] > 0 and r["tokens_per_step"] == 32 for r in bench)
    assert "## bench" in proc.stdout
