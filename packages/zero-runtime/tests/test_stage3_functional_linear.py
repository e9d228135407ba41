"""``zero_optimization.memory_efficient_linear`` (default true, as DeepSpeed): a stage-3 engine or
``zero.Init`` routes ``torch.nn.functional.linear`` through stage 3's linear for the rest of the
process, so a module calling ``F.linear`` on its partitioned weight saves the parameter for
backward (freed after forward) instead of a view pinning the gathered data, and trains exactly as
plain PyTorch. With the key false ``F.linear`` stays torch's. Each case runs in a fresh
interpreter: the swap is process-wide and persistent."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)

SCRIPT = r"""
import json, sys
import torch, torch.nn.functional as F
from ds.zero.engine import ZeroEngine
from ds.zero.init import GatheredParameters, Init
from ds.zero.stage3.linear import zero3_linear

flag = sys.argv[1] == "on"
torch_linear = F.linear

class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(3, 4))
        self.b = torch.nn.Parameter(torch.randn(3))

    def forward(self, x):
        return F.linear(x, self.w, self.b).square().sum()

torch.manual_seed(0); ref = M(); torch.manual_seed(0); model = M()
x = torch.randn(2, 4)
opt = torch.optim.SGD(ref.parameters(), lr=0.1)
ref(x).backward(); opt.step()
cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 0.0,
       "zero_allow_untested_optimizer": True,
       "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                             "memory_efficient_linear": flag}}
engine = ZeroEngine(model, cfg, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
saved = []
with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t is model.w) or t, lambda t: t):
    loss = engine(x)
released = model.w.numel() == 0
engine.backward(loss)
engine.step()
with GatheredParameters(list(model.parameters())):
    same = all(torch.allclose(a, b, atol=1e-6) for a, b in zip(model.parameters(), ref.parameters()))
print(json.dumps({"swapped": F.linear is zero3_linear, "backup": getattr(Init, "linear_bk", None) is torch_linear,
                  "saves_param": any(saved), "released": released, "same": same}))
"""


def _run(flag: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, flag], capture_output=True, text=True, timeout=110
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_functional_linear_on_partitioned_weights_saves_the_parameter() -> None:
    got = _run("on")
    assert got == {
        "swapped": True,
        "backup": True,
        "saves_param": True,
        "released": True,
        "same": True,
    }


def test_memory_efficient_linear_false_leaves_torch_linear() -> None:
    got = _run("off")
    assert got["swapped"] is False and got["backup"] is False
    assert got["saves_param"] is False  # torch's F.linear saves a view of the gathered weight
    assert got["same"] is True
