"""``simulate_memory`` (behind ``ds estimate``) bounds the steady state of training.

Optimizers make their state in the first ``step()``, so the first step's backward runs without
it; the estimate's step peak must cover a later step, whose backward holds the optimizer state,
the gradients and the activations at once. The reference is the same simulated rank trained for
four steps, its device peak read after the engine was built.
"""

from __future__ import annotations

import gc

import pytest
import torch
from tiny_models import llama_shape

import ds.full as ds
from ds.interfaces.comm import NCCL_CAPABILITIES
from ds.sim.accelerator import SimDevice, SimGpuAccelerator
from ds.sim.comm import SimWorld
from ds.sim.estimate import simulate_memory
from ds.sim.world import _process_state, sim_kernels

pytestmark = [pytest.mark.simgpu]

transformers = pytest.importorskip("transformers")


def _build(device: torch.device) -> torch.nn.Module:
    cfg = transformers.LlamaConfig(**llama_shape(64, 176, heads=4, vocab=512, positions=64))
    with torch.device(device):
        return transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)


def _config(stage: int) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 1,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
        "zero_optimization": {"stage": stage},
        "steps_per_print": 10**9,
    }


def _steady_peak(stage: int, steps: int = 4) -> int:
    import ds.full as ds

    world = SimWorld(2, None, NCCL_CAPABILITIES)
    with sim_kernels():
        sim, accel = SimDevice(0, 2**50), SimGpuAccelerator()
        with world.rank(0) as comm, sim, _process_state(comm, accel):
            accel.set_device(sim.index)
            engine, *_ = ds.initialize(model=_build(sim.device), config=_config(stage))
            sim.reset_peak()
            for _ in range(steps):
                ids = torch.zeros(1, 16, dtype=torch.long, device=sim.device)
                engine.backward(engine(input_ids=ids, labels=ids).loss)
                engine.step()
                del ids
                gc.collect()
            peak = sim.device_bytes().peak
            engine.destroy()
    return peak


@pytest.mark.parametrize("stage", [1, 2])
def test_step_peak_covers_the_steps_after_the_first(stage: int) -> None:
    est = simulate_memory(
        _build, _config(stage), 2, initialize=ds.initialize, ranks=[0], seq_len=16
    )[0]
    steady = _steady_peak(stage)
    # Every step from the second on is alike: the estimate reaches the steady peak (and holds the
    # step's output a little longer than this loop does).
    assert steady <= est.device_peak <= 1.02 * steady, (est.device_peak, steady)
    assert est.device_peak > est.device_states


def test_gloo_runs_are_simulated_on_the_host_route_of_stage_3() -> None:
    """On gloo, ranks train host tensors and stage 3 reduces each gradient in place; on NCCL it
    packs a group of gradients into one reduce-scatter input. A gloo estimate simulates CPU
    ranks, which take the host route as a real one does, so it counts no packed copy (here the
    whole model's bf16 gradients, all in one bucket) and no idle gather buffers."""
    numel = sum(p.numel() for p in _build(torch.device("meta")).parameters())
    cfg = _config(3)
    cfg["zero_optimization"]["stage3_param_persistence_threshold"] = 0  # every parameter sharded
    gloo = simulate_memory(
        _build, cfg, 2, initialize=ds.initialize, ranks=[0], seq_len=16, backend="gloo"
    )[0]
    nccl = simulate_memory(
        _build, cfg, 2, initialize=ds.initialize, ranks=[0], seq_len=16, backend="nccl"
    )[0]
    assert nccl.device_peak - gloo.device_peak >= 2 * numel, (nccl, gloo, numel)
    # Between steps a CPU rank holds its half of the model states (bf16 shards, fp32 masters, two
    # Adam moments) and nothing idle: released host buffers go back to the heap. A GPU rank's
    # gather pool keeps up to a prefetch bucket and the largest parameter besides.
    states = numel // 2 * (2 + 3 * 4)
    assert abs(gloo.device_states - states) <= 0.01 * states, (gloo, states)
    assert nccl.device_states - gloo.device_states >= min(2 * numel, 0.2 * states), (nccl, gloo)
    assert gloo.host_peak == 0  # one memory: all of it is in the device figures


@pytest.mark.parametrize("op", ["adam", "adagrad", "lion"])
def test_simulated_optimizer_kernels_allocate_no_full_size_temporary(op: str) -> None:
    """Fused kernels update in place; the simulated ones may allocate one slice's temporaries
    (4 MiB of fp32), never a copy of a whole 8M-element state."""
    from ds.interfaces.kernels import AdagradHyper, AdamHyper, LionHyper
    from ds.sim.kernels import SimKernels

    with SimDevice(0) as sim:
        k = SimKernels("cuda")
        n = 8 << 20
        p, g, m, v = (torch.zeros(n, device=sim.device) for _ in range(4))
        low = torch.zeros(n, dtype=torch.bfloat16, device=sim.device)
        sim.reset_peak()
        before = sim.device_bytes().current
        if op == "adam":
            k.adam_step(1, AdamHyper(lr=1e-3), p, g, m, v, low)
        elif op == "adagrad":
            k.adagrad_step(1, AdagradHyper(lr=1e-3), p, g, m, low)
        else:
            k.lion_step(1, LionHyper(lr=1e-3), p, g, m, low)
        assert sim.device_bytes().peak - before <= 4 * 2**20 + 4096


def test_real_tensors_take_the_exact_sliced_update() -> None:
    """On real values the sliced update equals the whole-tensor one (the simulation's Adam
    rule, without bias correction) across a slice boundary and an odd tail."""
    from ds.interfaces.kernels import AdamHyper
    from ds.sim import kernels as sim_kernels

    n = sim_kernels._CHUNK + 7
    g = torch.Generator().manual_seed(0)
    p, grad, m = (torch.randn(n, generator=g) for _ in range(3))
    v = torch.rand(n, generator=g)
    hyper = AdamHyper(lr=1e-2)
    want_m = m * hyper.beta1 + grad * (1 - hyper.beta1)
    want_v = v * hyper.beta2 + grad * grad * (1 - hyper.beta2)
    want_p = p - hyper.lr * want_m / (want_v.sqrt() + hyper.eps)
    low = torch.empty(n, dtype=torch.bfloat16)
    sim_kernels.SimKernels("cpu").adam_step(1, hyper, p, grad, m, v, low)
    torch.testing.assert_close(m, want_m)
    torch.testing.assert_close(v, want_v)
    torch.testing.assert_close(p, want_p)
    assert torch.equal(low, p.to(torch.bfloat16))
