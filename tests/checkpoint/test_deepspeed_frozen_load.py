"""Frozen (requires_grad=False) parameters come back from a checkpoint at another world size.

DeepSpeed keeps frozen parameters apart from the optimizer's: whole in the module state at stages
0-2, one fragment per rank at stage 3 (fixtures frozen_stage2/3_fp32, saved at world 2 by DeepSpeed
0.19.8). ``engine.load_checkpoint`` into a ds engine at world 1 and 3 must restore them, and ds's
own stage-1 (whole) and stage-3 (fragments again) checkpoints must too. The frozen layer of every checkpoint holds the
seed-1234 initial weights of the fixture model; the loading model starts from other ones, so a load
that skipped frozen parameters leaves them different.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

FIXTURES = Path(__file__).with_name("deepspeed_fixtures")
WORKER = Path(__file__).with_name("_frozen_worker.py")
DS = Path(sys.executable).with_name("ds")
FROZEN = ("fc1.weight", "fc1.bias")
LOADS = ["frozen_stage2_fp32@0", "frozen_stage2_fp32@3", "frozen_stage3_fp32@1",
         "frozen_stage3_fp32@3", "ds_stage3@2", "ds_stage3@3", "ds_stage1@3"]  # fmt: skip
# Saved with exclude_frozen_parameters=True (DeepSpeed's keyword; transformers passes it for PEFT
# models): the loaded model keeps its own frozen weights.
EXCLUDED = ["ds_excluded1@1", "ds_excluded3@3"]


def _initial_frozen(seed: int = 1234) -> dict[str, torch.Tensor]:
    sys.path.insert(0, str(FIXTURES))
    from deepspeed_fixture_spec import TinyNet

    torch.manual_seed(seed)
    model = TinyNet(freeze_fc1=True)
    return {n: p.detach().reshape(-1) for n, p in model.named_parameters() if n in FROZEN}


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [1, 3])
def test_frozen_parameters_load_at_another_world_size(world: int, tmp_path: Path) -> None:
    from ds.checkpoint.deepspeed_format import consolidated_fp32_state_dict

    out = tmp_path / "out.json"
    where = {n: tmp_path / n for n in ("ds_stage1", "ds_stage3", "ds_excluded1", "ds_excluded3")}
    specs = []
    for case in LOADS + EXCLUDED:
        name, _, stage = case.partition("@")
        specs.append(f"{where.get(name, FIXTURES / name)}@{stage}")
    cmd = [str(DS), "run", "--nproc", str(world), str(WORKER), str(out)]
    cmd += ["--save", f"{where['ds_stage1']}@1", "--save", f"{where['ds_stage3']}@3"]
    cmd += ["--save", f"{where['ds_excluded1']}@1@exclude"]
    cmd += ["--save", f"{where['ds_excluded3']}@3@exclude"]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run(
        cmd + specs, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=280
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    got = json.loads(out.read_text())
    assert sorted(got) == sorted(LOADS + EXCLUDED)
    want = _initial_frozen()
    own = _initial_frozen(seed=4321)  # the loading model's initial weights (_frozen_worker.py)
    for case in EXCLUDED:
        for name in FROZEN:
            assert not torch.equal(own[name], want[name])
            torch.testing.assert_close(torch.tensor(got[case]["loaded"][name]), own[name])
    for case in LOADS:
        source = FIXTURES / case.partition("@")[0]
        trained = consolidated_fp32_state_dict(str(source)) if not case.startswith("ds_") else {}
        for name, values in got[case]["loaded"].items():
            if name in FROZEN:
                ref = want[name]
            elif name in trained:
                ref = trained[name].reshape(-1)
            else:
                continue
            torch.testing.assert_close(torch.tensor(values), ref, rtol=0, atol=0, msg=case)
        for name in FROZEN:  # a training step leaves them as they are
            assert got[case]["stepped"][name] == got[case]["loaded"][name], (case, name)
        assert got[case]["stepped"]["fc2.weight"] != got[case]["loaded"]["fc2.weight"], case
