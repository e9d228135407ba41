"""Unchanged DeepSpeed programs on ds through the opt-in ``deepspeed`` API route (``ds compat
enable``), 2 CPU ranks: DeepSpeedExamples' cifar10_deepspeed.py (random data) and a stock
transformers Trainer script passing ``deepspeed="ds_config.json"`` (training, and evaluation
with a ZeRO-3 config and no optimizer), and a stock accelerate script
with ``Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config="ds_config.json"))``.

Each runs in a throwaway venv that sees the dev environment (tests/integrations/_compat_env.py), so
enabling the route never touches the shared environment.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _compat_env import make_env

HERE = Path(__file__).parent
CIFAR = HERE / "deepspeed_examples" / "cifar10_deepspeed.py"
STOCK = HERE / "stock_hf"
ACCELERATE = HERE / "stock_accelerate"
ANNOUNCE = "the 'deepspeed' API in this process is served by ds"


@pytest.fixture(scope="module")
def compat_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    py = make_env(tmp_path_factory.mktemp("compat-env") / "venv")
    cmd = [str(py), "-m", "ds.launcher", "compat", "enable"]  # the 'ds compat' verb
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "served by ds" in proc.stdout, proc.stdout + proc.stderr
    return py


def _trials(test: Any) -> Any:
    """The marks of a test that runs a real example end to end."""
    return pytest.mark.slow(pytest.mark.multiprocess(pytest.mark.timeout(600)(test)))


def _ds_run(py: Path, cwd: Path, *args: str, env: dict[str, str] | None = None) -> str:
    cmd = [str(py), "-m", "ds.launcher", "run", "--nproc", "2", *args]
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    proc = subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=560)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    return out


@_trials
def test_cifar10_deepspeed_example_runs_unchanged(compat_python: Path, tmp_path: Path) -> None:
    result = tmp_path / "result.json"
    out = _ds_run(
        compat_python, tmp_path, str(CIFAR), "--deepspeed", "--dtype", "fp32", "--stage", "2",
        "--epochs", "2", env={"CIFAR_RESULT": str(result)},
    )  # fmt: skip
    got = json.loads(result.read_text())
    assert got["world"] == 2 and got["tested"] == 16
    assert got["steps"] == 8  # 64 samples / train_batch_size 16, 2 epochs
    assert len(got["losses"]) == 8 and all(0 < x < 10 for x in got["losses"])
    assert out.count(ANNOUNCE) == 1  # one line, from rank 0
    assert "Finished Training" in out


@_trials
def test_stock_transformers_trainer_runs_on_ds(compat_python: Path, tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    out = _ds_run(
        compat_python, tmp_path, str(STOCK / "train.py"),
        "--deepspeed", str(STOCK / "ds_config.json"), "--output_dir", str(out_dir),
    )  # fmt: skip
    got = json.loads((out_dir / "result.json").read_text())
    assert got["engine"] == "ds.zero.engine.ZeroEngine" and got["world"] == 2
    assert got["steps"] == 6 and len(got["losses"]) == 6
    assert out.count(ANNOUNCE) == 1
    ref_file = STOCK / "deepspeed_reference.json"
    ref = json.loads(ref_file.read_text())  # the same script under DeepSpeed 0.19.8 (2 CPU ranks)
    assert got["rates"] == pytest.approx(ref["rates"], abs=1e-9)
    assert got["losses"] == pytest.approx(ref["losses"], abs=1e-5)


@_trials
def test_stock_transformers_evaluate_zero3_without_optimizer(
    compat_python: Path, tmp_path: Path
) -> None:
    # Trainer.evaluate with no training: transformers drops the optimizer and builds a ZeRO-3
    # engine for inference, which partitions the model across the 2 ranks.
    out_dir = tmp_path / "out"
    _ds_run(compat_python, tmp_path, str(STOCK / "evaluate.py"), "--output_dir", str(out_dir))
    got = json.loads((out_dir / "result.json").read_text())
    assert got["engine"] == "ds.zero.engine.ZeroEngine" and got["world"] == 2
    assert got["optimizer"] == "NoOptimizer" and got["partitioned"]
    # The mean over 4 batches of 2 rows (split over the ranks) of an equal-length loss: the
    # loss of all 8 rows at once, up to float32 summation order.
    assert got["eval_loss"] == pytest.approx(got["plain_loss"], abs=1e-5)


def _plain_torch_losses() -> list[float]:
    """The accelerate script's training in one process: each step's global batch of 4 rows (2
    per rank), AdamW and clipping at 1.0 as its ds_config.json says."""
    spec = importlib.util.spec_from_file_location("stock_accelerate_train", ACCELERATE / "train.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)  # its main() runs only as __main__
    model, (x, y) = script.make_model(), script.make_data().tensors
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    losses = []
    for step in range(script.STEPS):
        rows = slice(4 * step, 4 * step + 4)
        loss = torch.nn.functional.mse_loss(model(x[rows]), y[rows])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    return losses


@_trials
def test_stock_accelerate_deepspeed_plugin_runs_on_ds(compat_python: Path, tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    out = _ds_run(
        compat_python, tmp_path, str(ACCELERATE / "train.py"), "--output_dir", str(out_dir)
    )
    got = json.loads((out_dir / "result.json").read_text())
    assert got["engine"] == "ds.zero.engine.ZeroEngine" and got["world"] == 2
    assert out.count(ANNOUNCE) == 1
    ref = json.loads((ACCELERATE / "deepspeed_reference.json").read_text())  # DeepSpeed 0.19.8
    assert ref["world"] == 2 and len(got["losses"]) == len(ref["losses"]) == 6
    assert got["losses"] == pytest.approx(ref["losses"], abs=1e-5)
    assert got["losses"] == pytest.approx(_plain_torch_losses(), abs=1e-5)


@_trials
def test_accelerate_launch_use_deepspeed_runs_on_ds(compat_python: Path, tmp_path: Path) -> None:
    # `accelerate launch --use_deepspeed` on one machine starts its ranks with torchrun in-process
    # (DeepSpeed's own launcher only for several machines), after checking that a deepspeed
    # distribution is installed: the compat route answers that check.
    out_dir = tmp_path / "out"
    cmd = [
        str(compat_python), "-m", "accelerate.commands.accelerate_cli", "launch",
        "--use_deepspeed", "--num_processes", "2", "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no",
        "--deepspeed_config_file", str(ACCELERATE / "ds_config.json"),
        str(ACCELERATE / "train.py"), "--output_dir", str(out_dir),
    ]  # fmt: skip
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=560)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    got = json.loads((out_dir / "result.json").read_text())
    assert got["engine"] == "ds.zero.engine.ZeroEngine" and got["world"] == 2
    assert ANNOUNCE in out
    ref = json.loads((ACCELERATE / "deepspeed_reference.json").read_text())  # DeepSpeed 0.19.8
    assert got["losses"] == pytest.approx(ref["losses"], abs=1e-5)


def test_disable_removes_the_route(tmp_path: Path) -> None:
    from ds.full.compat import enable

    site = tmp_path / "site"
    site.mkdir()
    path = enable.enable(str(site))
    text = path.read_text()
    assert text.startswith("import sys; exec(") and text.count("\n") == 1  # one .pth line
    assert "disabled" not in enable.status(str(site))
    assert enable.disable(str(site)) and not path.exists()
    assert enable.status(str(site)).startswith("disabled")
    assert not enable.disable(str(site))


def test_config_given_twice_is_refused_as_deepspeed_refuses() -> None:
    import argparse

    import ds.full.compat.deepspeed as deepspeed
    from ds.interfaces.errors import ConfigError

    args = argparse.Namespace(deepspeed=True, deepspeed_config="ds_config.json")
    with pytest.raises(ConfigError, match=r"config is given twice.*--deepspeed_config"):
        deepspeed.initialize(args=args, model=object(), config={"train_batch_size": 2})
    old = argparse.Namespace(deepscale_config="a.json", deepspeed_config="b.json")
    with pytest.raises(ConfigError, match="--deepscale_config and --deepspeed_config"):
        deepspeed.initialize(args=old, model=object())
