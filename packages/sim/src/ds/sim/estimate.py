"""Per-rank memory of a training configuration, measured on a simulated world.

``simulate_memory`` builds the model on chosen ranks of a simulated world of ``world_size`` ranks
(each on its own fake ``cuda:local_rank``; on a backend for ranks without a GPU, gloo or mpi,
each a CPU rank whose compute device is the host: :mod:`ds.sim.cpu_rank`), runs
``ds.initialize`` with the given config and two training steps on a batch of token ids, and reads
the bytes the simulation saw: the device's model-state bytes left after them (parameters,
gradients kept, masters, optimizer state, persistent buffers), its peak during the steps (plus
activations and transient buffers), its peak while the model and the engine were built (the whole
model is built before it is partitioned; ``ds.zero.Init`` is not simulated yet) and the host's. A
CPU rank has one memory: its device figures count every byte and its host figures are 0. Ranks of
one world hold the same state up to the partitioning remainder, so measuring rank 0 and the last
rank bounds the rest; the collectives are not replayed (``check=False``).

``initialize`` is the composition root's ``initialize`` (``ds.full.initialize``), passed in by the
caller: ds-sim builds on ds.accel and ds.comm only and never reaches the composition root itself.
Advertised as ``ds.simulations: memory`` for ds-autotune's ``ds estimate``.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ds.interfaces.comm import GLOO_CAPABILITIES, NCCL_CAPABILITIES
from ds.sim._observer import DeviceStats
from ds.sim.accelerator import SimDevice, SimGpuAccelerator
from ds.sim.comm import SimWorld
from ds.sim.cpu_rank import SimCpuAccelerator, cpu_rank_state
from ds.sim.world import _process_state, sim_kernels

STEPS = 2  # training steps simulated per rank; the peak is over all of them


@dataclass(frozen=True)
class RankMemory:
    """One rank's bytes. On a CPU rank the device is the host: ``device_*`` count all of its
    memory and ``host_*`` are 0, so device + host is the rank's memory on either kind."""

    rank: int
    device_states: int  # device bytes held after the step (model states + persistent buffers)
    device_peak: int  # device peak during the training step
    device_init_peak: int  # device peak while building the model and the engine
    host_states: int
    host_peak: int


def simulate_memory(
    build_model: Callable[[torch.device], torch.nn.Module],
    config: dict[str, Any],
    world_size: int,
    *,
    initialize: Callable[..., Any],
    ranks: Sequence[int] | None = None,
    micro_batch: int = 1,
    seq_len: int = 16,
    local_size: int | None = None,
    device_bytes: int = 2**50,
    backend: str = "nccl",
) -> list[RankMemory]:
    """Memory of ``ranks`` (default: the first and the last) training ``build_model(device)``
    with ``config``. ``build_model`` makes the model on the given (fake) device; ``initialize``
    builds the engine (``ds.full.initialize``). ``backend``: ``nccl`` simulates GPU ranks;
    ``gloo`` and ``mpi`` (ds's backends for ranks without a GPU) simulate CPU ranks."""
    host = backend in ("gloo", "mpi")
    caps = GLOO_CAPABILITIES if host else NCCL_CAPABILITIES
    world = SimWorld(world_size, local_size, caps, host_ranks=host)
    with sim_kernels():  # fake tensors have no memory for the native or Triton kernels to walk
        return _simulate(
            build_model, initialize, config, world, ranks, micro_batch, seq_len, device_bytes
        )


def _simulate(
    build_model: Callable[[torch.device], torch.nn.Module],
    initialize: Callable[..., Any],
    config: dict[str, Any],
    world: SimWorld,
    ranks: Sequence[int] | None,
    micro_batch: int,
    seq_len: int,
    device_bytes: int,
) -> list[RankMemory]:
    chosen = sorted(set(ranks if ranks is not None else (0, world.world_size - 1)))
    out: list[RankMemory] = []
    # As in run_world: the collections and memory censuses below walk only the ranks' objects.
    gc.freeze()
    try:
        _measure_ranks(
            world, chosen, out, build_model, initialize, config, micro_batch, seq_len, device_bytes
        )
    finally:
        gc.unfreeze()
    return out


def _measure_ranks(
    world: SimWorld,
    chosen: list[int],
    out: list[RankMemory],
    build_model: Callable[[torch.device], torch.nn.Module],
    initialize: Callable[..., Any],
    config: dict[str, Any],
    micro_batch: int,
    seq_len: int,
    device_bytes: int,
) -> None:
    for rank in chosen:
        host = world.host_ranks
        sim = SimDevice(world.local_rank(rank), device_bytes, selected=False, host=host)
        with world.rank(rank) as comm, sim, _rank_state(comm, host):
            model = build_model(sim.device)
            engine, *_ = initialize(model=model, config=dict(config))
            init_peak = sim.device_bytes().peak
            sim.reset_peak()  # the step's peak from here: states + activations + buffers
            # Two steps: optimizers make their state in the first step(), so only the second
            # step's backward runs with every state live beside the gradients and activations.
            for _ in range(STEPS):
                ids = torch.zeros(micro_batch, seq_len, dtype=torch.long, device=sim.device)
                result = engine(input_ids=ids, labels=ids)
                loss = result.loss if hasattr(result, "loss") else result
                engine.backward(loss)
                engine.step()
                del result, loss, ids
                gc.collect()
            dev = sim.device_bytes()
            # A CPU rank's host bytes are its device bytes, already counted.
            apart = DeviceStats() if host else sim.host_bytes()
            out.append(
                RankMemory(rank, dev.current, dev.peak, init_peak, apart.current, apart.peak)
            )
            release = getattr(engine, "destroy", None)
            if release is not None:
                release()
            del engine, model
            gc.collect()


def _rank_state(comm: Any, host: bool) -> Any:
    """The process state of a simulated GPU rank, or of a CPU rank when ``host``."""
    if host:
        return cpu_rank_state(comm, SimCpuAccelerator())
    return _process_state(comm, SimGpuAccelerator())
