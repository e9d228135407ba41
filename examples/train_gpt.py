"""Train a small GPT with ds: ZeRO data parallelism, checkpoint, run ledger, readiness report.

    ds run --nproc 2 examples/train_gpt.py --config examples/ds_config_zero2.json

The dataset is generated: token sequences from a fixed random "grammar" (each token's successor is
drawn from a few likely choices), so the loss falls visibly within a minute on a laptop CPU.

Each run starts from an empty ``--out`` directory (a previous run's output there is removed), and
ends by leaving torch.distributed explicitly (see ``shutdown``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import ds.full as ds
from ds import comm as dist


# -- model ---------------------------------------------------------------------------------------
class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        B, T, D = x_BTD.shape
        q, k, v = self.qkv(self.ln1(x_BTD)).split(D, dim=-1)
        q, k, v = (t.view(B, T, self.heads, D // self.heads).transpose(1, 2) for t in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x_BTD = x_BTD + self.proj(att.transpose(1, 2).reshape(B, T, D))
        return x_BTD + self.mlp(self.ln2(x_BTD))


class GPT(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, seq: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx_BT: torch.Tensor, targets_BT: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx_BT) + self.pos(torch.arange(idx_BT.shape[1]))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x)).float()
        return F.cross_entropy(logits.flatten(0, 1), targets_BT.flatten())


# -- data ----------------------------------------------------------------------------------------
class GrammarDataset(torch.utils.data.Dataset):
    """Sequences where each token is followed by one of 4 successors (fixed per token)."""

    def __init__(self, size: int, vocab: int, seq: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        successors = torch.randint(0, vocab, (vocab, 4), generator=g)
        choice = torch.randint(0, 4, (size, seq + 1), generator=g)
        data = torch.empty(size, seq + 1, dtype=torch.long)
        data[:, 0] = torch.randint(0, vocab, (size,), generator=g)
        for t in range(1, seq + 1):
            data[:, t] = successors[data[:, t - 1], choice[:, t]]
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.data[i, :-1], self.data[i, 1:]


# -- main ----------------------------------------------------------------------------------------
def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="examples/ds_config_zero2.json")
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--out", default="runs/train_gpt")
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    args = p.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))

    ds.init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    out = Path(args.out)
    if rank == 0 and out.exists():
        # Each run starts fresh: the previous run's checkpoint would otherwise be overwritten,
        # which the run's mutation boundary refuses without a recorded approval.
        shutil.rmtree(out)
    dist.barrier()
    torch.manual_seed(0)
    model = GPT(args.vocab, args.d_model, args.layers, args.heads, args.seq)
    config = json.loads(Path(args.config).read_text())
    micro = int(config["train_micro_batch_size_per_gpu"])
    gas = int(config.get("gradient_accumulation_steps", 1))
    data = GrammarDataset(args.steps * micro * gas * world, args.vocab, args.seq)

    t0 = time.perf_counter()
    engine, _, loader, _ = ds.initialize(
        model=model, config=config, training_data=data, ledger_path=str(out / "ledger.jsonl")
    )
    init_s = time.perf_counter() - t0

    bar = _progress(rank == 0, args.steps)
    losses, step_times = [], []
    tokens = 0
    t_train = time.perf_counter()
    for idx, targets in loader:
        loss = engine(idx, targets)
        engine.backward(loss)
        engine.step()
        tokens += idx.numel() * world
        m = engine.last_metrics
        if m is not None and m.step > len(losses):
            losses.append(_global_mean(m.loss or 0.0, world))
            step_times.append(m.step_time_s)
            bar(m.step, losses[-1], m.lr)
        if engine.global_steps >= args.steps:
            break
    train_s = time.perf_counter() - t_train
    bar(None, None, None)

    engine.save_checkpoint(str(out / "checkpoints"), client_state={"steps": engine.global_steps})
    report = engine.gate.report() if engine.gate is not None else None
    mem = engine.memory_report()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    rss_all: list[int] = [0] * world
    dist.all_gather_object(rss_all, rss)
    integrity = engine.ledger.verify_ledger_integrity() if rank == 0 and engine.ledger else None
    if engine.ledger is not None:
        engine.ledger.close()
    if rank == 0:
        _summary(
            {
                "world size": world,
                "ZeRO stage": engine.zero_optimization_stage(),
                "parameters": f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f} M",
                "steps": engine.global_steps,
                "global batch (sequences)": engine.train_batch_size(),
                "loss first -> last": f"{losses[0]:.3f} -> {losses[-1]:.3f}",
                "median step time": f"{statistics.median(step_times) * 1e3:.1f} ms",
                "throughput": f"{tokens / train_s:,.0f} tokens/s",
                "model FLOP/s, MFU": _mfu(model, tokens / train_s, world),
                "initialize": f"{init_s:.2f} s",
                "optimizer state / rank": f"{mem.optimizer_state_bytes / 2**20:.2f} MiB",
                "gradients / rank": f"{mem.gradient_bytes / 2**20:.2f} MiB",
                "peak RSS per rank": ", ".join(f"{r / 2**30:.2f} GiB" for r in rss_all),
                "checkpoint": str(out / "checkpoints" / f"global_step{engine.global_steps}"),
                "ledger": f"{out / 'ledger.jsonl'} ({'intact' if integrity and integrity.ok else 'NOT VERIFIED'}, {integrity.records if integrity else 0} records)",
                "readiness score": f"{report.score:.1f} / 100 ({'pass' if report.passed else 'fail'})"
                if report
                else "n/a",
                "gate terms": _gate_terms(report) if report else "n/a",
            },
            report,
        )
    ok = losses[-1] < losses[0]
    shutdown(engine)
    return 0 if ok else 1


def shutdown(engine=None) -> None:  # type: ignore[no-untyped-def]
    """Leave torch.distributed while the interpreter is still whole.

    Without this the process group is torn down during interpreter finalization. gloo's worker
    threads (``pt_gloo_runloop``) drop their reference to the last finished collective a moment
    after the caller's ``wait()`` returns; when that is the last reference to a tensor made in
    Python, freeing it needs the GIL, and a thread that asks for the GIL while Python finalizes is
    ended with ``pthread_exit``, whose unwind through gloo's ``noexcept`` run loop aborts the
    process ("terminate called without an active exception", exit 134). The wider the window
    (more collectives in flight at the end, a loaded machine), the likelier it is. Waiting for a
    pending checkpoint, a barrier and destroy_process_group() join those threads first.
    """
    ckpt = getattr(engine, "checkpoint_engine", None)
    if ckpt is not None:
        ckpt.wait()  # an asynchronous save commits with collectives: before the group goes
    dist.barrier()
    dist.destroy_process_group()


def _global_mean(value: float, world: int) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t) / world


def _progress(enabled: bool, total: int):  # type: ignore[no-untyped-def]
    if not enabled:
        return lambda *a: None
    from tqdm import tqdm

    bar = tqdm(total=total, desc="train", unit="step", disable=None, file=sys.stderr)

    def update(step: int | None, loss: float | None, lr: float | None) -> None:
        if step is None:
            bar.close()
            return
        bar.update(step - bar.n)
        bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}")

    return update


def _mfu(model: torch.nn.Module, tokens_per_s: float, world: int) -> str:
    """Training FLOP/s by the dense rule (6 per parameter per token) and MFU against the
    device's peak: a GPU's datasheet figure, a CPU's measured GEMM ceiling at this rank's thread
    count (``ds bench peak``, cached), or DS_PEAK_TFLOPS per device."""
    from ds.monitor.peak import peak_flops_source

    p = next(model.parameters())
    rate = 6.0 * sum(x.numel() for x in model.parameters()) * tokens_per_s
    peak, source = peak_flops_source(p.device, p.dtype)
    if not peak:
        return f"{rate / 1e9:.2f} GFLOP/s, MFU n/a (set DS_PEAK_TFLOPS)"
    # Short enough for the summary table's row on an 80-column terminal.
    mfu = 100.0 * rate / (peak * world)
    return f"{rate / 1e9:.2f} GFLOP/s, MFU {mfu:.2f}% (of {peak * world / 1e9:.1f} {source})"


def _gate_terms(report) -> str:  # type: ignore[no-untyped-def]
    m = report.metrics
    text = (
        f"DDI {m.get('ddi', 0.0):.2f} (offload {m.get('ddi.offload', 0.0):.3f}, gather "
        f"{m.get('ddi.allgather_stall', 0.0):.3f}, sync {m.get('ddi.sync_wait', 0.0):.3f}, "
        f"drift {m.get('ddi.latency_degradation', 0.0):.3f}), "
        f"P99 {m.get('p99_step_latency_s', 0.0) * 1e3:.0f} ms"
    )
    return text + (f", ZOMM {m['zomm']:.3f}" if "zomm" in m else "")


def _summary(rows: dict[str, object], report) -> None:  # type: ignore[no-untyped-def]
    from rich.console import Console
    from rich.table import Table

    table = Table(title="ds train_gpt summary", show_header=False)
    table.add_column("", style="bold")
    table.add_column("")
    for k, v in rows.items():
        table.add_row(k, str(v))
    console = Console()
    console.print(table)
    if report is not None:
        for f in report.findings:
            console.print(f"  [{f.severity}] {f.message}")


if __name__ == "__main__":
    raise SystemExit(main())
