"""Lightning strategies on 2 CPU processes: loss parity with Lightning's own DDP strategy and a
checkpoint save/restore round trip through the ds engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

WORKER = Path(__file__).with_name("lightning_worker.py")
STRATEGIES = ["ds_zero1", "ds_zero2", "ds_zero3", "ds_zero3_offload"]
# fp32 on both sides; the sharded reductions sum in a different order than DDP's buckets.
RTOL = 1e-5

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]


def launch(tmp: Path, name: str, *args: str) -> dict[str, Any]:
    out = tmp / f"{name}.json"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run(
        [sys.executable, str(WORKER), "--out", str(out), *args],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    result: dict[str, Any] = json.loads(out.read_text())
    return result


@pytest.fixture(scope="module")
def parity(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("lightning")
    names = ["ddp", *STRATEGIES, "ds_zero2_config_optimizer"]
    return launch(tmp, "parity", "--strategies", ",".join(names), "--steps", "4")


def test_strategies_registered_on_import() -> None:
    from lightning.pytorch.strategies import StrategyRegistry

    import ds.integrations.lightning as dsl

    for name in STRATEGIES:
        assert name in StrategyRegistry
        assert StrategyRegistry[name]["strategy"] is dsl.DsStrategy
    assert StrategyRegistry["ds_zero3_offload"]["init_params"]["offload_optimizer"] is True


@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy", [*STRATEGIES, "ds_zero2_config_optimizer"])
def test_loss_parity_with_ddp(parity: dict[str, Any], strategy: str) -> None:
    ref = parity["ddp"]["losses"]
    got = parity[strategy]["losses"]
    # 4 optimizer steps x 2 accumulated micro-batches, on rank 0.
    assert len(ref) == 8 and len(got) == 8
    assert parity[strategy]["global_step"] == 4
    assert got == pytest.approx(ref, rel=RTOL)
    # Training moved the weights: the last losses are not the first ones.
    assert got[-1] != pytest.approx(got[0], rel=1e-3)


@pytest.mark.timeout(600)
def test_checkpoint_round_trip(parity: dict[str, Any], tmp_path: Path) -> None:
    """Stop after 2 steps, save, resume to 4 steps: ds_zero3 restores weights, optimizer state and
    Lightning's loop state exactly as Lightning's DDP strategy does with its own checkpoints
    (Lightning resumes a run stopped by max_steps inside its accumulation window, so the resumed
    run is compared with DDP doing the same, not with the uninterrupted run)."""
    ckpt = tmp_path / "ckpt"
    pair = "ddp,ds_zero3"
    first = launch(tmp_path, "first", "--strategies", pair, "--steps", "2", "--save", str(ckpt))
    assert (ckpt / "ds_zero3" / "latest").exists()
    resumed = launch(
        tmp_path, "resumed", "--strategies", pair, "--steps", "4", "--resume", str(ckpt)
    )
    full = parity["ds_zero3"]["losses"]
    assert first["ds_zero3"]["losses"] == pytest.approx(full[:4], rel=RTOL)
    assert resumed["ds_zero3"]["global_step"] == 4
    got, ref = resumed["ds_zero3"]["losses"], resumed["ddp"]["losses"]
    assert len(got) == len(ref) >= 3
    # The first resumed loss is the uninterrupted run's: the restored weights are the trained ones.
    assert got[0] == pytest.approx(full[4], rel=RTOL)
    assert got == pytest.approx(ref, rel=RTOL)


@pytest.mark.parametrize(("clip", "want"), [(None, 0.0), (0.0, 0.0), (0.5, 0.5)])
def test_absent_gradient_clipping_follows_the_trainer_as_lightning_does(clip, want) -> None:
    # Lightning's DeepSpeedStrategy writes `gradient_clip_val or 0.0` when the config has no key;
    # DeepSpeed's own default (1.0) would clip a run the Trainer was told not to clip.
    from functools import partial

    from ds.integrations.lightning._engine import build_config

    build = partial(
        build_config, stage=2, offload_optimizer=False, offload_parameters=False,
        micro_batch_size=2, accumulate_grad_batches=1, gradient_clip_val=clip,
        precision="32-true",
    )  # fmt: skip
    assert build(None)["gradient_clipping"] == want
    assert build({"gradient_clipping": 2.0})["gradient_clipping"] == 2.0  # the config wins
