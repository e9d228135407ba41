"""``deepspeed.utils.safe_set_full_fp32_param`` and friends: a parameter's fp32 master and
optimizer state, read and written through the engine ``deepspeed.initialize`` made, at every
ZeRO stage, in fp32 and bf16, on one rank and on two (where the masters are partitioned)."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from ds.full.compat import deepspeed
from ds.full.compat.deepspeed import utils as U
from ds.full.compat.deepspeed._missing import FeatureNotAvailableError

sys.path.insert(0, str(Path(__file__).parents[1] / "support"))

_RUN = textwrap.dedent(
    """
    import json, sys, torch
    from ds.full.compat import deepspeed
    from ds.full.compat.deepspeed import utils as U

    def run(stage, bf16, x):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
        cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": stage},
               "optimizer": {"type": "AdamW", "params": {"lr": 0.0, "weight_decay": 0.0}}}
        if bf16:
            cfg["bf16"] = {"enabled": True}
            x = x.bfloat16()
        engine, *_ = deepspeed.initialize(model=model, config=cfg)
        engine.backward(engine(x).float().sum())
        engine.step()
        p = list(engine.module.parameters())[2]
        value = torch.arange(6, dtype=torch.float32).view(2, 3) * 0.1 + 0.01
        U.safe_set_full_fp32_param(p, value)
        U.safe_set_full_optimizer_state(p, torch.full((2, 3), 0.5), "exp_avg")
        set_ok = torch.equal(U.safe_get_full_optimizer_state(p, "exp_avg"), torch.full((2, 3), 0.5))
        engine.backward(engine(x).float().sum())
        engine.step()  # lr 0: the master keeps the value set, the parameter is copied from it
        with deepspeed.zero.GatheredParameters([p]):
            param = p.detach().float().clone()
        return {
            "master": torch.equal(U.safe_get_full_fp32_param(p), value),
            "param": torch.allclose(param, value, atol=1e-2),
            "state_set": set_ok,
            # exp_avg moved from 0.5 by the second step (beta1 0.9): the set state was used
            "state_used": bool((U.safe_get_full_optimizer_state(p, "exp_avg") - 0.45).abs().max() < 0.2),
            "local": U.safe_get_local_fp32_param(p).numel(),
        }
    """
)
_RANK = _RUN + textwrap.dedent(
    """
    torch.manual_seed(1)
    x = torch.randn(1, 4)
    out = {f"{s}-{b}": run(s, b, x) for s in json.loads(sys.argv[1]) for b in (False, True)}
    print("RESULT " + json.dumps(out))
    """
)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_set_and_get_full_master_and_state_one_rank(stage: int) -> None:
    ns: dict = {}
    exec(_RUN, ns)  # the ranks' function, here in this process
    torch.manual_seed(1)
    x = torch.randn(1, 4)
    for bf16 in (False, True):
        r = ns["run"](stage, bf16, x)
        assert r == {"master": True, "param": True, "state_set": True, "state_used": True,
                     "local": 6}, (stage, bf16)  # fmt: skip


def test_two_ranks_partitioned_masters(tmp_path: Path) -> None:
    from world import free_port, run_ranks, world_env

    script = tmp_path / "rank.py"
    script.write_text(_RANK)
    port = str(free_port())
    outs = run_ranks(
        lambda r: [str(script), json.dumps([2, 3])], 2, timeout=180,
        env=lambda r: world_env({"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2",
                                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}),
    )  # fmt: skip
    results = []
    for o in outs:
        assert o.returncode == 0, o.stdout[-3000:]
        results.append(json.loads(o.stdout.split("RESULT ", 1)[1]))
    for key in results[0]:
        for r in results:
            assert {k: v for k, v in r[key].items() if k != "local"} == {
                "master": True, "param": True, "state_set": True, "state_used": True,
            }, key  # fmt: skip
        # each rank holds a piece of the partitioned master; together the whole parameter
        assert sum(r[key]["local"] for r in results) == 6, key


def test_a_parameter_no_engine_trains_is_refused_by_the_setters() -> None:
    p = torch.nn.Parameter(torch.ones(3))
    assert torch.equal(U.safe_get_full_fp32_param(p), torch.ones(3))
    with pytest.raises(FeatureNotAvailableError, match=r"deepspeed\.initialize"):
        U.safe_set_full_fp32_param(p, torch.zeros(3))
    with pytest.raises(FeatureNotAvailableError, match="safe_get_full_optimizer_state"):
        U.safe_get_full_optimizer_state(p, "exp_avg")
    assert deepspeed.utils.safe_set_local_fp32_param is U.safe_set_local_fp32_param
