"""Checks an installed ds-ops-kernels wheel against whatever torch this interpreter has.

Run with the interpreter of a venv holding another torch version and the wheels built here (see
docs/ops.md, "Build"), ideally with an empty PATH so that any compiler call would fail:

    env -i PATH= HOME=/tmp /path/to/venv/bin/python packages/ops-kernels/tools/check_other_torch.py

CPUAdam must match torch.optim.AdamW within 1e-6 relative over 20 steps, a bf16 step must stay
finite, and the native quantizers must produce the torch reference's bytes.
"""

import os

import torch

import ds.ops
from ds.ops import cpu_optim
from ds.ops.optim import CPUAdam
from ds.ops.quant import native, reference

print("torch", torch.__version__, "PATH", repr(os.environ.get("PATH")))
print(ds.ops.info())
torch.manual_seed(0)
p = torch.nn.Parameter(torch.randn(10_007))
q = torch.nn.Parameter(p.detach().clone())
ours = CPUAdam([p], lr=1e-2, weight_decay=0.01)
theirs = torch.optim.AdamW([q], lr=1e-2, weight_decay=0.01)
for _ in range(20):
    g = torch.randn(10_007)
    p.grad, q.grad = g.clone(), g.clone()
    ours.step()
    theirs.step()
err = float((p - q).detach().abs().max() / q.detach().abs().max())
print("CPUAdam vs torch.optim.AdamW, 20 steps, max rel err", err)
assert err < 1e-6
b = torch.randn(4099).to(torch.bfloat16)
m = torch.zeros(4099, dtype=torch.bfloat16)
v = torch.zeros_like(m)
cpu_optim.adam_step(b, torch.randn(4099).to(torch.bfloat16), m, v, step=1, lr=1e-3)
assert bool(b.isfinite().all())
x = torch.randn(100_000)
for scheme in ("int8_sym", "int4_asym", "fp8_e4m3"):
    a, c = reference.quantize(x, scheme, 128), native.quantize(x, scheme, 128)
    assert torch.equal(a.data.view(torch.uint8), c.data.view(torch.uint8))
    assert torch.equal(a.scales, c.scales)
print("quantizers: native bytes == torch reference bytes")
print("ok")
