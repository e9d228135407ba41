"""The CPU-checkable parts of the GPU check (tools/gpu/prepare.sh, check.sh, check.py): its
arguments, the model it builds, what travels, row isolation, and the whole route as the GPU
machine takes it (wheels installed with pip --no-index --no-deps --target into a fresh venv that
has no ds, the native extension built there) with the CPU dry run of every row."""

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
    assert args.sections == ["install", "parity", "kernels", "bandwidth", "bench", "serve"]
    assert args.stages == [0, 1, 2, 3] and args.size == "1b" and args.device == "cuda"
    assert args.systems == ["torch FSDP2", "ds ZeRO-2", "ds ZeRO-3"]
    assert check.parse_args(["--sections", "bench,parity", "--stages", "3"]).stages == [3]
    dry = check.parse_args(["--dry-run"])
    assert (dry.device, dry.size, dry.seq, dry.steps) == ("cpu", "tiny", 16, 1)
    names = [(r.section, r.name) for r in check.rows(args)]
    assert ("parity", "ZeRO-3 + offload") in names and ("parity", "ZeRO-0 + offload") not in names
    for kernel in ("adam bfloat16", "lion float16", "adagrad float32", "quantize int4_sym",
                   "quantize fp8_e4m3", "swiglu fwd+bwd", "paged attention bfloat16"):  # fmt: skip
        assert ("kernels", kernel) in names
    assert [n for s, n in names if s == "bandwidth"] == [
        "device copy", "fused adam (fp32)", "paged attention decode (bf16)"]  # fmt: skip
    assert [n for s, n in names if s == "serve"] == [
        "greedy parity with transformers", "transformers generate", "ds engine"]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sections", "parity,train"], "unknown section(s) train"),
        (["--stages", "1,4"], "are not ZeRO stages"),
        (["--stages", "a"], "not a comma-separated list of integers"),
        (["--steps", "0"], "must be >= 1"),
        (["--systems", "ds,megatron"], "unknown ['megatron']"),
        (["--device", "tpu"], "use cuda or cpu"),
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


def test_check_sh_refuses_to_run_without_a_gpu(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable, "DS_GPU_INSTALL": "0", "OUT": str(tmp_path)}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    proc = subprocess.run(
        [str(GPU / "check.sh"), "--sections", "install"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the check would really run")
    assert proc.returncode == 1
    assert "no CUDA device is visible (pass --device cpu)" in proc.stdout + proc.stderr
    assert "no CUDA device is visible" in (tmp_path / "check.log").read_text()
    usage = subprocess.run(
        [str(GPU / "check.sh"), "--help"], capture_output=True, text=True, env=env, timeout=120
    )
    assert usage.returncode == 0 and "--sections" in usage.stdout and "--dry-run" in usage.stdout
    env["DS_GPU_INSTALL"], env["DS_GPU_WHEELS"] = "1", str(tmp_path / "none")
    nowheels = subprocess.run([str(GPU / "check.sh")], capture_output=True, text=True, env=env)
    assert nowheels.returncode == 2 and "run tools/gpu/prepare.sh" in nowheels.stdout


def _ctx() -> check.Ctx:
    return check.Ctx(check.parse_args(["--dry-run"]), torch.device("cpu"), "cpu", tiny=True)


def test_a_row_that_raises_or_overruns_ends_alone() -> None:
    def boom(ctx: check.Ctx, deadline: float) -> dict[str, object]:
        raise RuntimeError("kernel exploded")

    def slow(ctx: check.Ctx, deadline: float) -> dict[str, object]:
        import time

        while True:
            time.sleep(0.05)

    def fine(ctx: check.Ctx, deadline: float) -> dict[str, object]:
        return {"value": 1.0, "ok": True}

    ctx = _ctx()
    bad = check.run_row(check.Row("kernels", "boom", 10, boom), ctx, 100)
    assert bad["status"] == "error" and bad["error"] == "RuntimeError: kernel exploded"
    late = check.run_row(check.Row("kernels", "slow", 3.2, slow), ctx, 100)
    assert late["status"] == "error" and "row budget spent" in late["error"]
    assert 3.0 <= late["seconds"] < 10
    good = check.run_row(check.Row("kernels", "fine", 10, fine), ctx, 100)
    assert good["status"] == "pass" and good["value"] == 1.0 and "ok" not in good
    spent = check.run_row(check.Row("kernels", "fine", 10, fine), ctx, 2)
    assert spent == {"section": "kernels", "row": "fine", "status": "skipped",
                     "reason": "the global budget is spent"}  # fmt: skip
    on_cpu = check.run_row(check.Row("bench", "fine", 10, fine, cuda_verdict=True), ctx, 100)
    assert on_cpu["status"] == "skipped" and on_cpu["reason"].startswith("needs CUDA")
    report = {"rows": [bad, late, good, spent, on_cpu]}
    assert check.failures(report) == [
        "kernels/boom: error RuntimeError: kernel exploded",
        "kernels/slow: error RowTimeout: row budget spent",
    ]


def test_bench_goal_is_fsdp2_speed_and_half_the_peak() -> None:
    v = check.bench_verdict
    assert v("torch FSDP2", {"value": 100.0, "mfu": 0.3}, None)["ok"] is True
    assert v("ds ZeRO-2", {"value": 110.0, "mfu": 0.55}, 100.0) == {
        "value": 110.0, "mfu": 0.55, "vs_fsdp2": 1.1, "ok": True}  # fmt: skip
    assert v("ds ZeRO-3", {"value": 99.0, "mfu": 0.6}, 100.0)["ok"] is False  # slower
    assert v("ds ZeRO-3", {"value": 120.0, "mfu": 0.45}, 100.0)["ok"] is False  # MFU short
    assert v("ds ZeRO-2", {"value": 120.0, "mfu": None}, 100.0)["ok"] is False  # no peak known
    assert v("ds ZeRO-2", {"value": 120.0, "mfu": 0.6}, None)["ok"] is None  # FSDP2 failed
    ctx = _ctx()
    row = check.run_row(
        check.Row("bench", "x", 10, lambda c, d: {"value": 1.0, "ok": None}), ctx, 99
    )
    assert row["status"] == "skipped" and "reference" in row["reason"]


def test_what_travels_covers_every_need_the_image_lacks() -> None:
    import carry

    need = carry.missing()
    # The ones the image is known to lack, and every third-party need of ds not in the image.
    for name in ("pydantic", "pydantic-core", "annotated-types", "typing-inspection", "structlog",
                 "cryptography", "gguf"):  # fmt: skip
        assert name in need, name
    image = carry.image_packages()
    assert "torch" in image and "triton" in image and "transformers" in image
    assert not any(n in image for n in need if n not in carry.ALWAYS)
    assert not any(n.startswith("ds-") for n in need)
    dists = [d.name for d in carry.ds_dists()]
    assert dists[-1] == "ops-kernels" and "interfaces" in dists and len(dists) >= 13


def _image_view(dest: Path) -> Path:
    """This environment's site-packages less ds (its dists, editable hooks, native module): the
    stand-in for the GPU image, which has torch and transformers but no ds."""
    import sysconfig

    site = Path(sysconfig.get_paths()["purelib"])
    dest.mkdir()
    for entry in site.iterdir():
        n = entry.name.lower()
        if n == "ds" or n.startswith(("ds_", "ds-", "_editable", "__editable__")):
            continue
        (dest / entry.name).symlink_to(entry)
    return dest


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_install_route_in_a_fresh_venv_and_the_dry_run(tmp_path: Path) -> None:
    wheels, site, out = tmp_path / "whl", tmp_path / "site", tmp_path / "out"
    prep = subprocess.run(
        [str(GPU / "prepare.sh"), "--no-download", "--dest", str(wheels)],
        capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert prep.returncode == 0, prep.stdout[-2000:] + prep.stderr[-2000:]
    assert "of 64" in prep.stdout
    built = sorted(p.name.split("-")[0] for p in wheels.glob("*.whl"))
    assert "ds_interfaces" in built and "ds_full" in built and "ds_ops_kernels" not in built

    venv = tmp_path / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    (Path(purelib) / "image.pth").write_text(str(_image_view(tmp_path / "image")) + "\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "PYTHONPATH", "VIRTUAL_ENV")}  # fmt: skip
    bare = subprocess.run([str(py), "-c", "import ds.interfaces"], capture_output=True, env=env)
    assert bare.returncode != 0, "the fresh venv must start without ds"

    env.update(PYTHON=str(py), DS_GPU_WHEELS=str(wheels), DS_GPU_SITE=str(site), OUT=str(out),
               PIP_NO_INDEX="1", DS_GPU_CHECK_SECONDS="800")  # fmt: skip
    proc = subprocess.run(
        [str(GPU / "check.sh"), "--dry-run", "--stages", "0,3"],
        capture_output=True, text=True, env=env, timeout=850,
    )  # fmt: skip
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-5000:]
    assert (site / "wheels" / "ds" / "interfaces").is_dir()
    assert list((site / "native").glob("ds_ops_kernels-*.dist-info"))
    assert "installed into" in log and "ds-interfaces 0.1.0" in log
    report = json.loads((out / "check.json").read_text())
    assert (out / "check.log").is_file()
    by = {(r["section"], r["row"]): r for r in report["rows"]}
    install = by[("install", "distributions and native extension")]
    assert install["status"] == "pass", install
    assert (
        install["native"].startswith(str(site / "native"))
        and install["kernels"] == "cpu,cuda,torch"
    )
    assert {s for s, _ in by} == set(check.SECTIONS)
    for (section, row), r in by.items():
        if section in ("bandwidth", "bench") or row in ("transformers generate", "ds engine"):
            # Their verdicts need a GPU; their code ran and measured at tiny size.
            assert r["status"] == "skipped" and r["reason"].startswith("needs CUDA"), r
            assert r["value"] is not None and r["value"] > 0, r
        else:
            assert r["status"] == "pass", r
    assert [r for s, r in by if s == "parity"] == ["ZeRO-0", "ZeRO-3", "ZeRO-3 + offload"]
    assert by[("serve", "greedy parity with transformers")]["attention"] == "triton"
    assert "## kernels" in proc.stdout
