"""DeepSpeed's ``engine.offload_states()``/``reload_states()`` as an RLHF script calls them between
phases, through the ``deepspeed`` API route (``deepspeed.runtime.zero.offload_config``'s enums,
``include=``, ``device=``, ``pin_memory``, ``non_blocking``): the losses equal a run without it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import json
    from ds.full.compat import _hook
    _hook.activate()  # what 'ds compat enable' does at interpreter start
    import torch
    import deepspeed
    from deepspeed.runtime.zero.offload_config import OffloadDeviceEnum, OffloadStateTypeEnum

    def run(stage, offload):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
        cfg = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": stage},
               "optimizer": {"type": "Adam", "params": {"lr": 1e-2}}}
        engine, *_ = deepspeed.initialize(model=model, config=cfg, model_parameters=model.parameters())
        g = torch.Generator().manual_seed(1)
        losses = []
        for step in range(4):
            if offload and step == 2:  # a generation phase would run here
                engine.offload_states(
                    include=[OffloadStateTypeEnum.optim_states, OffloadStateTypeEnum.hp_params,
                             OffloadStateTypeEnum.lp_grads],
                    device=OffloadDeviceEnum.cpu, pin_memory=True, non_blocking=True)
                engine.reload_states(non_blocking=True)
            loss = engine(torch.randn(4, 8, generator=g)).square().mean()
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        return losses

    print(json.dumps({s: [run(s, False), run(s, True)] for s in (2, 3)}))
    """
)


def test_offload_states_through_the_deepspeed_api() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = json.loads(proc.stdout.strip().splitlines()[-1])
    for stage, (plain, offloaded) in runs.items():
        assert len(plain) == 4 and plain == offloaded, stage
