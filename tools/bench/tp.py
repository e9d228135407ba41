"""Tensor parallelism: ds AutoTP vs torch DTensor TP on a transformers Llama, world 2 (gloo, CPU).

One 2-rank run builds the same random Llama on both ranks (same seed) and splits one copy with
``ds.parallel.tp.autotp`` and another with torch's ``parallelize_module`` on a ``DeviceMesh``
(the same plan: q/k/v/gate/up colwise, o/down rowwise, the embedding split over the vocabulary,
lm_head colwise with its output gathered). Each gets a plain ``torch.optim.AdamW``. Steps
(zero_grad + forward + backward + AdamW step) run in interleaved blocks with alternating order, so
drift on a shared machine hits both alike; a step's time is the slower rank's. Step 0's losses must
agree with each other and with the unsplit model.

Memory runs in separate processes (one model per process, so RSS is that model's): TP=1 (the plain
model, one process) and TP=2 with each implementation: peak RSS (VmHWM) per rank, RSS growth over
the process's state after imports and group set-up, and the exact bytes of parameters + grads +
AdamW state per rank. Load average at start and end.

    python tools/bench/tp.py [--steps 5] [--repeats 5] [--tiny] [--no-memory]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
from harness import Bench, free_port

SIZES = {
    "default": dict(hidden=256, inter=688, layers=4, heads=8, kv=4, vocab=1024, seq=128, micro=4),
    "tiny": dict(hidden=64, inter=128, layers=2, heads=4, kv=2, vocab=128, seq=32, micro=2),
}


def _model(size: dict[str, int]) -> Any:
    import torch
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.LlamaConfig(
        vocab_size=size["vocab"],
        hidden_size=size["hidden"],
        intermediate_size=size["inter"],
        num_hidden_layers=size["layers"],
        num_attention_heads=size["heads"],
        num_key_value_heads=size["kv"],
        max_position_embeddings=size["seq"],
        tie_word_embeddings=False,
        attn_implementation="eager",
        bos_token_id=0,
        eos_token_id=0,
    )
    return tf.AutoModelForCausalLM.from_config(cfg).float().train()


def _batch(size: dict[str, int], step: int) -> Any:
    import torch

    g = torch.Generator().manual_seed(1000 + step)
    return torch.randint(0, size["vocab"], (size["micro"], size["seq"]), generator=g)


def _vm(key: str) -> int:
    """A /proc/self/status field in bytes (VmHWM: peak RSS; VmRSS: current)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def _ds_split(model: Any, comm: Any) -> Any:
    from ds.parallel.mesh import build_mesh, mesh_shape_from_config
    from ds.parallel.tp import autotp

    world = comm.get_world_size()
    mesh = build_mesh(comm, mesh_shape_from_config(world, world, 1))
    autotp(model, mesh, comm)
    return model


def _torch_split(model: Any, world: int) -> Any:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", (world,))
    # transformers 5.x Llama attention reshapes with -1 heads, so local q/k/v shards give
    # heads/world local heads without touching the module's attributes.
    layer_plan = {
        "self_attn.q_proj": ColwiseParallel(),
        "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(),
        "self_attn.o_proj": RowwiseParallel(),
        "mlp.gate_proj": ColwiseParallel(),
        "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(),
    }
    for layer in model.model.layers:
        parallelize_module(layer, mesh, layer_plan)
    # Same as ds's plan for the ends: vocabulary-split embedding, lm_head gathered to full logits.
    parallelize_module(
        model,
        mesh,
        {
            "model.embed_tokens": RowwiseParallel(input_layouts=Replicate()),
            "lm_head": ColwiseParallel(output_layouts=Replicate()),
        },
    )
    return model


def _state_bytes(model: Any, opt: Any) -> int:
    """Local bytes of parameters, gradients and AdamW state on this rank."""
    import torch

    def local(t: Any) -> Any:
        return t.to_local() if hasattr(t, "to_local") else t

    n = 0
    for p in model.parameters():
        n += local(p).numel() * local(p).element_size()
        if p.grad is not None:
            n += local(p.grad).numel() * local(p.grad).element_size()
    for st in opt.state.values():
        for v in st.values():
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                n += local(v).numel() * local(v).element_size()
    return n


def _stepper(model: Any, size: dict[str, int]) -> tuple[Any, Any]:
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    count = [0]
    # This rank's seconds in forward, backward and the optimizer, summed over the steps (the
    # split that explains the step-time ratio).
    phases = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}

    def step() -> float:
        ids = _batch(size, count[0])
        count[0] += 1
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids).loss
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        phases["forward"] += t1 - t0
        phases["backward"] += t2 - t1
        phases["optimizer"] += t3 - t2
        return float(loss.detach())

    step.phases = phases  # type: ignore[attr-defined]

    return step, opt


def _init(rank: int, world: int, port: str) -> Any:
    import torch
    import torch.distributed as tdist

    # Imported before the memory baseline is read, so RSS growth is the model's and the run's.
    import transformers.models.llama.modeling_llama  # noqa: F401

    from ds.interfaces.registry import get

    torch.set_num_threads(1)
    tdist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    return get("ds.comm_backends", "torch")()


def _worker_time(args: argparse.Namespace, rank: int, world: int, port: str) -> None:
    import torch
    import torch.distributed as tdist

    size = SIZES[args.size]
    comm = _init(rank, world, port)
    ref = _model(size)
    ds_model = _ds_split(copy.deepcopy(ref), comm)
    torch_model = _torch_split(copy.deepcopy(ref), world)
    ids = _batch(size, 0)
    with torch.no_grad():
        loss0 = {
            "plain": float(ref(input_ids=ids, labels=ids).loss),
            "ds": float(ds_model(input_ids=ids, labels=ids).loss),
            "torch": float(torch_model(input_ids=ids, labels=ids).loss),
        }
    del ref
    steppers = {"ds": _stepper(ds_model, size)[0], "torch": _stepper(torch_model, size)[0]}
    for fn in steppers.values():
        for _ in range(args.warmup):
            fn()
        fn.phases.update(dict.fromkeys(fn.phases, 0.0))  # count the timed steps only
    times: dict[str, list[float]] = {k: [] for k in steppers}
    losses: dict[str, list[float]] = {k: [] for k in steppers}
    for r in range(args.repeats):
        order = list(steppers) if r % 2 == 0 else list(reversed(steppers))
        for name in order:
            for _ in range(args.steps):
                tdist.barrier()
                t0 = time.perf_counter()
                losses[name].append(steppers[name]())
                t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
                # The step is as slow as its slowest rank.
                tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
                times[name].append(float(t))
    if rank == 0:
        with open(args.worker_out, "w") as f:
            n = max(1, args.steps * args.repeats)
            phases = {k: {ph: v / n for ph, v in fn.phases.items()} for k, fn in steppers.items()}
            json.dump({"loss0": loss0, "times": times, "losses": losses, "phases": phases}, f)
    tdist.destroy_process_group()


def _worker_mem(args: argparse.Namespace, rank: int, world: int, port: str) -> None:
    """One model in this process, a few steps, then peak RSS; impl 'plain' is TP=1, world 1."""
    import torch.distributed as tdist

    size = SIZES[args.size]
    comm = _init(rank, world, port)
    base = _vm("VmRSS")
    model = _model(size)
    if args.mem_impl == "ds":
        _ds_split(model, comm)
    elif args.mem_impl == "torch":
        _torch_split(model, world)
    step, opt = _stepper(model, size)
    for _ in range(args.mem_steps):
        step()
    row = {
        "rank": rank,
        "peak_rss": _vm("VmHWM"),
        "base_rss": base,
        "state_bytes": _state_bytes(model, opt),
    }
    rows: list[Any] = [None] * world
    tdist.all_gather_object(rows, row)
    if rank == 0:
        with open(args.worker_out, "w") as f:
            json.dump(rows, f)
    tdist.destroy_process_group()


def _spawn(world: int, extra: list[str], timeout: float) -> Any:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        port = str(free_port())
        procs = []
        for r in range(world):
            env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), OMP_NUM_THREADS="1")
            env["BENCH_PORT"] = port
            cmd = [sys.executable, __file__, "--worker-out", out, *extra]
            procs.append(subprocess.Popen(cmd, env=env))
        deadline = time.monotonic() + timeout
        rcs = []
        for p in procs:
            try:
                rcs.append(p.wait(timeout=max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                p.kill()
                rcs.append(-9)
        if any(rcs):
            raise SystemExit(f"a rank failed (exit codes {rcs}) running {' '.join(extra)}")
        with open(out) as f:
            return json.load(f)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=5, help="steps per block")
    p.add_argument("--repeats", type=int, default=5, help="interleaved blocks per implementation")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--mem-steps", type=int, default=3)
    p.add_argument("--no-memory", action="store_true", help="skip the memory runs")
    p.add_argument("--tiny", action="store_const", dest="size", const="tiny", default="default")
    p.add_argument("--timeout", type=float, default=600.0, help="per spawned run, seconds")
    p.add_argument("--worker-out", default=None, help=argparse.SUPPRESS)
    p.add_argument("--mem-impl", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker_out:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        port = os.environ["BENCH_PORT"]
        (_worker_mem if args.mem_impl else _worker_time)(args, rank, world, port)
        return 0

    load_start = os.getloadavg()
    common = ["--steps", str(args.steps), "--repeats", str(args.repeats)]
    common += ["--warmup", str(args.warmup), "--mem-steps", str(args.mem_steps)]
    if args.size == "tiny":
        common.append("--tiny")
    timed = _spawn(2, common, args.timeout)
    mem = {}
    for impl, world in () if args.no_memory else (("plain", 1), ("ds", 2), ("torch", 2)):
        mem[impl] = _spawn(world, [*common, "--mem-impl", impl], args.timeout)
    load_end = os.getloadavg()

    loss0 = timed["loss0"]
    ok = abs(loss0["ds"] - loss0["torch"]) < 1e-4 and abs(loss0["ds"] - loss0["plain"]) < 1e-4
    size = SIZES[args.size]
    case = (
        f"Llama h{size['hidden']} L{size['layers']} heads {size['heads']}/{size['kv']} "
        f"vocab {size['vocab']}, {size['micro']}x{size['seq']} fp32, TP=2 gloo"
    )
    bench = Bench("tp", peer="torch")
    for impl in ("ds", "torch"):
        bench.add(impl, case, timed["times"][impl], loss0=loss0[impl])
    ds_med = statistics.median(timed["times"]["ds"])
    torch_med = statistics.median(timed["times"]["torch"])
    print(
        f"step 0 loss: plain {loss0['plain']:.6f} ds {loss0['ds']:.6f} torch {loss0['torch']:.6f}"
    )
    print(
        f"step time median: ds {ds_med * 1e3:.1f} ms, torch {torch_med * 1e3:.1f} ms, "
        f"ratio ds/torch {ds_med / torch_med:.3f}x"
    )
    print("memory (MiB)      | peak RSS | RSS growth | params+grads+AdamW")
    for impl, rows in mem.items():
        label = "TP=1 plain" if impl == "plain" else f"TP=2 {impl}"
        for row in rows:
            print(
                f"{label:10s} rank {row['rank']} | {row['peak_rss'] / 2**20:8.1f} | "
                f"{(row['peak_rss'] - row['base_rss']) / 2**20:10.1f} | "
                f"{row['state_bytes'] / 2**20:.2f}"
            )
    for impl, ph in timed["phases"].items():
        parts = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in ph.items())
        print(f"rank 0 mean per step, {impl}: {parts}")
    print(f"load average: start {load_start}, end {load_end}")
    out = bench.report()
    data = json.loads(out.read_text())
    data.update(
        loss0=loss0,
        loss0_agree=ok,
        ratio_ds_torch=ds_med / torch_med,
        phases_rank0_mean_s=timed["phases"],
        memory=mem,
        load_start=load_start,
        load_end=load_end,
        args=vars(args),
    )
    out.write_text(json.dumps(data, indent=2))
    if not ok:
        print("step 0 losses disagree", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
