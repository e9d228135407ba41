"""Expert parallelism folded onto tensor parallelism: ``expert_parallel.autoep_size=2`` with
``tensor_parallel.autotp_size=2`` on a world of 2 (one data-parallel rank; each TP rank sends half
of the routes to the expert-parallel ranks). Three SGD steps with gradient clipping end at the
losses and weights of the plain model trained in one process, for DeepSpeed-layout AutoEP layers
(ZeRO 0 and 2) and a transformers Mixtral whose attention AutoTP splits (ZeRO 1): a route counted
twice, a replicated gradient left partial or a norm counting experts twice would all show."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _autoep_folded_worker import STEPS, build, inputs, loss_of  # noqa: E402
from _ranks_launch import run_scenarios  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(240)]

# route:stage, and ":ep" for expert parallelism alone (DeepSpeed-layout layers at autoep_size 2).
SCENARIOS = ["blocks:0", "blocks:2", "mixtral:1", "blocks:1:ep"]


@pytest.fixture(scope="module")
def folded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("folded")
    return run_scenarios(HERE / "_autoep_folded_worker.py", 2, out, SCENARIOS, timeout=220)


def _alone(route: str) -> dict:
    net = build(route)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    losses = []
    for step in range(STEPS):
        loss = loss_of(route, net(**inputs(route, step)))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    return {"losses": losses, "weights": {k: v.detach() for k, v in net.state_dict().items()}}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_folded_expert_parallel_matches_one_process(folded: dict, scenario: str) -> None:
    got, want = folded[scenario], _alone(scenario.split(":")[0])
    torch.testing.assert_close(
        torch.tensor(got["losses"]), torch.tensor(want["losses"]), rtol=1e-5, atol=1e-6
    )
    assert set(got["weights"]) >= {k for k in want["weights"] if "rotary" not in k}
    for name, w in want["weights"].items():
        if name in got["weights"]:
            torch.testing.assert_close(got["weights"][name], w, rtol=1e-5, atol=1e-6, msg=name)
    for name, w in got["weights"].items():  # a checkpoint of the folded layout loads back
        torch.testing.assert_close(got["resumed"][name], w, rtol=0, atol=0, msg=name)
    assert got["layout"] == {
        "tp": 1 if scenario.endswith(":ep") else 2,
        "tp_src": 0,
    }  # DeepSpeed's engine.autotp_size(), groups
    exported = torch.load(got["dir"] / "model.pt", weights_only=True)
    experts = [n for n in exported if ".experts." in n]
    assert experts and all(exported[n].shape[0] == 4 for n in experts)  # E rows, not E / ep
    if scenario.startswith("mixtral"):  # transformers' fused tensors, every expert
        for name in experts:
            torch.testing.assert_close(exported[name], want["weights"][name], rtol=1e-5, atol=1e-6)
