"""A training or serving process never imports the simulation (ds-sim patches torch's CUDA hooks).

Checked in a fresh interpreter: importing the packages a training or serving process loads, and
detecting the accelerator, leaves ``ds.sim`` unimported and torch's CUDA entry points untouched.
"""

import subprocess
import sys

PROBE = """
import sys
import torch
before = (torch.cuda.get_device_capability, torch.cuda.is_available())
import ds.accel, ds.comm, ds.zero, ds.inference, ds.full
import ds.full.devices, ds.full.training
ds.accel.get_accelerator()
loaded = sorted(m for m in sys.modules if m == "ds.sim" or m.startswith("ds.sim."))
assert not loaded, f"imported the simulation: {loaded}"
assert (torch.cuda.get_device_capability, torch.cuda.is_available()) == before
print("clean")
"""


def test_runtime_packages_do_not_import_the_simulation() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert out.stdout.strip().endswith("clean")


def test_the_probe_sees_the_simulation_when_it_is_imported() -> None:
    """The probe can fail: importing ds.sim.world (as a test does) shows in its check."""
    probe = PROBE.replace("ds.accel.get_accelerator()", "import ds.sim.world")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=240)
    assert out.returncode != 0 and "imported the simulation" in out.stderr, out.stderr[-2000:]
