"""The GPU check: ``tools/gpu/check.sh`` runs it on one GPU; every row is pass/fail plus a number.

Rows, by section (all by default, in this order):

- ``install``: the ds distributions found through their entry points, the native extension;
- ``parity``: ZeRO stages 0-3, 1-3 also with CPU offload (optimizer; stage 3 parameters too), at
  world 1 on the accelerator's backend (NCCL on a GPU), against torch.optim.AdamW;
- ``kernels``: every Triton kernel (Adam, Lion, Adagrad in fp32/bf16/fp16; int8/int4/fp8
  quantization; SwiGLU forward and backward; paged attention) against its pure-torch reference;
- ``bandwidth``: the device's copy bandwidth; fused Adam as a fraction of it (goal >= 0.9);
  paged-attention decode as a fraction of it (goal >= 0.7);
- ``bench``: a ~1B Llama training step, torch FSDP2 then ds ZeRO-2 and ZeRO-3 on the same
  batches: tokens/s and MFU (goal: ds >= FSDP2 and MFU >= 0.5, bf16);
- ``serve``: greedy parity of the ds engine with transformers, then tokens/s of transformers
  ``generate`` and of the ds engine on the same model and prompts (goal: ds >= transformers).

Each row runs isolated (an exception or its time budget ends that row only) and the report is
rewritten after every row, so a run cut short still leaves what it measured. A global budget
(``--budget``) skips the rows it no longer has time for. ``--dry-run`` runs every row's code on
the CPU at tiny sizes (Triton through ``TRITON_INTERPRET=1``); a row whose verdict needs CUDA is
reported ``skipped`` with the reason, its code having run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

SECTIONS = ("install", "parity", "kernels", "bandwidth", "bench", "serve")
ROOT = Path(__file__).resolve().parents[2]
NEEDS_CUDA = "needs CUDA: timings and goals of a GPU (its code ran on the CPU at tiny size)"


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of integers"
        ) from None


def _sections(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in names if s not in SECTIONS]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"unknown section(s) {', '.join(bad) or '(none given)'}; choose from {', '.join(SECTIONS)}"
        )
    return names


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tools/gpu/check.sh", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--sections", type=_sections, default=list(SECTIONS),
                   help=f"comma-separated subset of {','.join(SECTIONS)} (default: all)")  # fmt: skip
    p.add_argument("--device", default="cuda", help="cuda (default; the rank's device) or cpu")
    p.add_argument("--dry-run", action="store_true",
                   help="every row on the CPU at tiny sizes (the suite's check of this script)")  # fmt: skip
    p.add_argument("--budget", type=float, default=420.0,
                   help="seconds for all rows together (default 420)")  # fmt: skip
    p.add_argument("--stages", type=_ints, default=[0, 1, 2, 3], help="ZeRO stages for parity")
    p.add_argument("--parity-steps", type=_positive, default=5)
    p.add_argument("--size", choices=("1b", "tiny"), default="1b", help="benchmark model size")
    p.add_argument("--batch", type=_positive, default=4, help="benchmark micro-batch")
    p.add_argument("--seq", type=_positive, default=2048, help="benchmark sequence length")
    p.add_argument("--steps", type=_positive, default=10, help="timed benchmark steps (at most)")
    p.add_argument("--warmup", type=_positive, default=2, help="untimed benchmark steps")
    p.add_argument("--bench-stage", type=int, choices=(0, 1, 2, 3), default=2,
                   help="ZeRO stage of the 'ds' system")  # fmt: skip
    p.add_argument("--systems", default="torch FSDP2,ds ZeRO-2,ds ZeRO-3",
                   help="benchmark rows, comma-separated")  # fmt: skip
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="dense bf16 peak for MFU (default: known from the device name)")  # fmt: skip
    p.add_argument("--out", type=Path, default=ROOT / "bench-results" / "gpu_check.json")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    if args.dry_run:
        args.device, args.size, args.batch, args.seq = "cpu", "tiny", 2, 16
        args.steps, args.warmup, args.parity_steps = 1, 1, 2
    if args.device not in ("cuda", "cpu"):
        build_parser().error(f"--device {args.device!r}: use cuda or cpu")
    bad = [s for s in args.stages if s not in (0, 1, 2, 3)]
    if bad:
        build_parser().error(f"--stages: {bad} are not ZeRO stages (0-3)")
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    from check_throughput import SYSTEMS

    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        build_parser().error(f"--systems: unknown {unknown}; choose from {', '.join(SYSTEMS)}")
    args.systems = systems
    return args


def world_one_env() -> None:
    """A one-rank job, as ``ds run --nproc 1`` would describe it."""
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("LOCAL_WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])


def table(title: str, rows: list[dict[str, Any]]) -> str:
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]

    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1e4 else f"{v:,.0f}"
        return "" if v is None else str(v)

    cells = [[fmt(r.get(k)) for k in keys] for r in rows]
    width = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    line = "| " + " | ".join(k.ljust(w) for k, w in zip(keys, width, strict=True)) + " |"
    rule = "|" + "|".join("-" * (w + 2) for w in width) + "|"
    body = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, width, strict=True)) + " |"
            for row in cells]  # fmt: skip
    return "\n".join([f"\n## {title}", line, rule, *body])


# -- rows ----------------------------------------------------------------------------------------
@dataclass
class Ctx:
    args: argparse.Namespace
    device: Any  # torch.device
    name: str
    tiny: bool
    shared: dict[str, Any] = field(default_factory=dict)

    @property
    def cuda(self) -> bool:
        return bool(self.device.type == "cuda")


@dataclass
class Row:
    section: str
    name: str
    budget: float  # seconds on a GPU (the dry run has the same)
    run: Callable[[Ctx, float], dict[str, Any]]  # (context, deadline) -> measurements
    cuda_verdict: bool = False  # pass/fail only means something on a GPU


class RowTimeout(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise RowTimeout("row budget spent")


def _install(ctx: Ctx, deadline: float) -> dict[str, Any]:
    from importlib import metadata

    dists = sorted(
        d.metadata["Name"] for d in metadata.distributions() if d.metadata["Name"].startswith("ds-")
    )
    import ds.ops._C as native  # built for this Python by check.sh
    from ds.interfaces import registry

    providers = registry.list_providers("ds.kernels")
    cls = registry.get("ds.kernels", "cuda" if ctx.cuda else "cpu")
    ok = len(dists) >= 12 and {"cpu", "cuda"} <= set(providers)
    return {"value": len(dists), "unit": "ds distributions", "kernels": ",".join(sorted(providers)),
            "provider": getattr(cls, "__name__", str(cls)), "native": native.__file__, "ok": ok}  # fmt: skip


def _parity(stage: int, offload: bool) -> Callable[[Ctx, float], dict[str, Any]]:
    def run(ctx: Ctx, deadline: float) -> dict[str, Any]:
        import check_parity

        row = check_parity.run_one(stage, offload, ctx.args.parity_steps, ctx.device)
        if not offload:  # without offload the trained module lives on the rank's device
            row["ok"] = row["ok"] and row["param_devices"] == [str(ctx.device)]
        return {"value": row["max_abs_diff"], "unit": "max abs diff", **row}

    return run


def _optimizer(kind: str, dtype: str) -> Callable[[Ctx, float], dict[str, Any]]:
    def run(ctx: Ctx, deadline: float) -> dict[str, Any]:
        import check_kernels as k

        n, steps = (4096 + 17, 2) if ctx.tiny else (10**6 + 17, 10)
        return k.optimizer(kind, k.DTYPES[dtype], n, steps, ctx.device)

    return run


def _quant(scheme: str) -> Callable[[Ctx, float], dict[str, Any]]:
    def run(ctx: Ctx, deadline: float) -> dict[str, Any]:
        import check_kernels as k

        return k.quantization(scheme, 64 * 40 + 8 if ctx.tiny else 2**22 + 8, ctx.device)

    return run


def _swiglu(ctx: Ctx, deadline: float) -> dict[str, Any]:
    import check_kernels as k

    return k.swiglu(1000 if ctx.tiny else 2**22 + 5, ctx.device)


def _paged(dtype: str) -> Callable[[Ctx, float], dict[str, Any]]:
    def run(ctx: Ctx, deadline: float) -> dict[str, Any]:
        import check_kernels as k

        return k.paged_attention(ctx.device, k.DTYPES[dtype], ctx.tiny)

    return run


def _copy_bw(ctx: Ctx, deadline: float) -> dict[str, Any]:
    import check_kernels as k

    row = k.copy_bandwidth(ctx.device, 2**20 if ctx.tiny else 2**31, 3 if ctx.tiny else 10)
    ctx.shared["copy_bw"] = row["bytes_per_s"]
    return row


def _adam_bw(ctx: Ctx, deadline: float) -> dict[str, Any]:
    import check_kernels as k

    n = 2**12 if ctx.tiny else 2**28
    return k.adam_bandwidth(ctx.device, n, 2 if ctx.tiny else 10, ctx.shared.get("copy_bw"))


def _decode_bw(ctx: Ctx, deadline: float) -> dict[str, Any]:
    import check_kernels as k

    return k.decode_bandwidth(
        ctx.device, ctx.tiny, 2 if ctx.tiny else 10, ctx.shared.get("copy_bw")
    )


def _bench(system: str) -> Callable[[Ctx, float], dict[str, Any]]:
    def run(ctx: Ctx, deadline: float) -> dict[str, Any]:
        import check_throughput
        from models import peak_tflops

        a = ctx.args
        peak = peak_tflops(ctx.name, a.peak_tflops)
        row = check_throughput.one(system, a.size, ctx.device, a.batch, a.seq, a.steps,
                                   a.warmup, a.bench_stage, peak, deadline)  # fmt: skip
        ctx.shared[system] = row["value"]
        return bench_verdict(system, row, ctx.shared.get("torch FSDP2"))

    return run


def bench_verdict(system: str, row: dict[str, Any], fsdp2: float | None) -> dict[str, Any]:
    """A ds row passes at FSDP2's tokens/s or more with an MFU of 0.5 or more; without an FSDP2
    reading it has no verdict. A torch row is a reference: its number is the measurement."""
    if not system.startswith("ds"):
        return {**row, "ok": True}
    if not fsdp2:
        return {**row, "ok": None}
    ratio = row["value"] / fsdp2
    return {**row, "vs_fsdp2": ratio, "ok": ratio >= 1.0 and (row.get("mfu") or 0.0) >= 0.5}


def _serve_parity(ctx: Ctx, deadline: float) -> dict[str, Any]:
    import check_inference

    # The kernel the engine picks on CUDA by default; on the CPU the same kernel, interpreted.
    return check_inference.parity(ctx.device, "triton", ctx.tiny)


def _serve(which: str) -> Callable[[Ctx, float], dict[str, Any]]:
    def run(ctx: Ctx, deadline: float) -> dict[str, Any]:
        import check_inference

        serve = ctx.shared.get("serve")
        if serve is None:
            serve = ctx.shared["serve"] = check_inference.Serve(ctx.device, ctx.tiny)
        return serve.transformers() if which == "transformers" else serve.ds()

    return run


def rows(args: argparse.Namespace) -> list[Row]:
    out = [Row("install", "distributions and native extension", 30, _install)]
    for stage in args.stages:
        for offload in (False, True) if stage > 0 else (False,):  # offload needs ZeRO 1-3
            label = f"ZeRO-{stage}" + (" + offload" if offload else "")
            out.append(Row("parity", label, 40, _parity(stage, offload)))
    for kind in ("adam", "lion", "adagrad"):
        for dtype in ("float32", "bfloat16", "float16"):
            out.append(Row("kernels", f"{kind} {dtype}", 20, _optimizer(kind, dtype)))
    for scheme in ("int8_sym", "int4_sym", "fp8_e4m3"):
        out.append(Row("kernels", f"quantize {scheme}", 20, _quant(scheme)))
    out.append(Row("kernels", "swiglu fwd+bwd", 20, _swiglu))
    for dtype in ("float32", "bfloat16"):
        out.append(Row("kernels", f"paged attention {dtype}", 30, _paged(dtype)))
    out += [
        Row("bandwidth", "device copy", 20, _copy_bw, cuda_verdict=True),
        Row("bandwidth", "fused adam (fp32)", 30, _adam_bw, cuda_verdict=True),
        Row("bandwidth", "paged attention decode (bf16)", 30, _decode_bw, cuda_verdict=True),
    ]
    for system in args.systems:
        out.append(Row("bench", system, 90, _bench(system), cuda_verdict=True))
    out += [
        Row("serve", "greedy parity with transformers", 40, _serve_parity),
        Row("serve", "transformers generate", 60, _serve("transformers"), cuda_verdict=True),
        Row("serve", "ds engine", 60, _serve("ds"), cuda_verdict=True),
    ]
    return [r for r in out if r.section in args.sections]


def run_row(row: Row, ctx: Ctx, remaining: float) -> dict[str, Any]:
    out: dict[str, Any] = {"section": row.section, "row": row.name}
    budget = min(row.budget, remaining)
    if budget < 3:
        return {**out, "status": "skipped", "reason": "the global budget is spent"}
    t0 = time.monotonic()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, budget)
    try:
        got = row.run(ctx, t0 + 0.6 * budget)
        signal.setitimer(signal.ITIMER_REAL, 0)
        out.update(got)
        ok = got.get("ok")
        if row.cuda_verdict and not ctx.cuda:
            out["status"], out["reason"] = "skipped", NEEDS_CUDA
        elif ok is None:
            out["status"], out["reason"] = "skipped", "no goal to judge without its reference row"
        else:
            out["status"] = "pass" if ok else "fail"
    except BaseException as exc:  # one row's failure (or its budget) must not stop the others
        signal.setitimer(signal.ITIMER_REAL, 0)
        if isinstance(exc, KeyboardInterrupt):
            raise
        out["status"] = "error"
        out["error"] = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:500]
        out["traceback"] = traceback.format_exc(limit=6)[-2000:]
    finally:
        signal.signal(signal.SIGALRM, previous)
    out.pop("ok", None)
    out["seconds"] = round(time.monotonic() - t0, 2)
    if ctx.cuda:
        import torch

        try:
            torch.cuda.synchronize(ctx.device)
            torch.cuda.empty_cache()
        except Exception as exc:  # a row that broke the context: later rows will say so
            out.setdefault("error", f"after the row: {type(exc).__name__}: {exc}")
    return out


def versions() -> dict[str, str]:
    import platform

    out = {"python": platform.python_version()}
    for mod in ("torch", "triton", "transformers", "pydantic", "structlog"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception as exc:
            out[mod] = f"missing ({type(exc).__name__})"
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    world_one_env()
    if args.device == "cpu":
        # Before any kernel is defined: the Triton kernels run through the interpreter.
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("tools/gpu/check.sh: no CUDA device is visible (pass --device cpu)")
        os.environ.setdefault("DS_ACCELERATOR", "cuda")
    else:
        os.environ["DS_ACCELERATOR"] = "cpu"
    import ds.full as ds

    ds.init_distributed()  # binds the rank's device, then NCCL (gloo on the CPU)
    from ds.full.training import rank_accelerator

    device = torch.device(rank_accelerator().current_device_name())
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    report: dict[str, Any] = {
        "device": name,
        "dry_run": args.dry_run,
        "versions": versions(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "budget_s": args.budget,
        "rows": [],
    }
    print(f"device {device} ({name}); {report['versions']}", flush=True)
    ctx = Ctx(args, device, name, tiny=args.size == "tiny" or device.type == "cpu")
    t0 = time.monotonic()
    for row in rows(args):
        result = run_row(row, ctx, args.budget - (time.monotonic() - t0))
        report["rows"].append(result)
        report["seconds"] = time.monotonic() - t0
        write(report, args.out)
        shown = {k: v for k, v in result.items() if k not in ("traceback", "section")}
        print(f"[{row.section}] {json.dumps(shown, default=str)}", flush=True)
    serve = ctx.shared.get("serve")
    if serve is not None:
        serve.close()
    for section in args.sections:
        rs = [
            {k: v for k, v in r.items() if k not in ("traceback", "section", "reason")}
            for r in report["rows"]
            if r["section"] == section
        ]
        if rs:
            print(table(section, rs), flush=True)
    return report


def write(report: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=2, default=str) + "\n")
    tmp.replace(out)


def failures(report: dict[str, Any]) -> list[str]:
    return [
        f"{r['section']}/{r['row']}: {r['status']} {r.get('error', '')}".rstrip()
        for r in report["rows"]
        if r["status"] in ("fail", "error")
    ]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = run(args)
    write(report, args.out)
    bad = failures(report)
    counts = {
        s: sum(r["status"] == s for r in report["rows"])
        for s in ("pass", "fail", "error", "skipped")
    }
    print(f"\n{report.get('seconds', 0):.0f} s; {counts}; JSON: {args.out}")
    for line in bad:
        print(f"FAILED {line}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
