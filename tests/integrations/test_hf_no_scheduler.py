"""A stock transformers Trainer script whose DeepSpeed config has an ``optimizer`` section and no
``scheduler`` section (axolotl's zero1.json, InternVL's configs): transformers then builds torch's
``LambdaLR`` (its linear warm-up/decay) on the engine's optimizer, which must be a real
``torch.optim.Optimizer`` at every ZeRO stage. 2 CPU ranks through the ``deepspeed`` API route."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_deepspeed_routes import STOCK, _ds_run, compat_python  # noqa: F401  (a fixture)

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

# transformers' linear schedule (warmup_steps=2 of max_steps=6, learning_rate=1e-2) as the Trainer
# logs it: the scheduler's rate after each step.
LINEAR = [0.005, 0.01, 0.0075, 0.005, 0.0025, 0.0]


def _run(py: Path, tmp: Path, stage: int, offload: str) -> dict[str, object]:
    zero: dict[str, object] = {"stage": stage}
    if offload != "none":
        zero["offload_optimizer"] = {"device": offload}
    config = {
        "train_micro_batch_size_per_gpu": "auto",
        "train_batch_size": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
        },
        "zero_optimization": zero,
    }
    path = tmp / f"zero{stage}.json"
    path.write_text(json.dumps(config))
    out = tmp / f"out{stage}"
    _ds_run(py, tmp, str(STOCK / "train.py"), "--deepspeed", str(path), "--output_dir", str(out))
    got: dict[str, object] = json.loads((out / "result.json").read_text())
    return got


@pytest.mark.timeout(900)
def test_optimizer_without_scheduler_trains_at_zero_1_2_3(
    compat_python: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    runs = {
        "zero1": _run(compat_python, tmp_path, 1, "none"),
        "zero2-offload": _run(compat_python, tmp_path, 2, "cpu"),
        "zero3": _run(compat_python, tmp_path, 3, "none"),
    }
    first = runs["zero1"]
    for name, got in runs.items():
        assert got["engine"] == "ds.zero.engine.ZeroEngine" and got["world"] == 2, name
        assert got["steps"] == 6, name
        # The Trainer's own schedule drove the engine's optimizer.
        assert got["rates"] == pytest.approx(LINEAR, abs=1e-9), name
        # The same training at every stage and on the offload kernels.
        assert got["losses"] == pytest.approx(first["losses"], abs=1e-5), name
    losses = first["losses"]
    assert isinstance(losses, list) and len(losses) == 6 and losses[-1] < losses[0]
