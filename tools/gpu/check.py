"""The real-GPU check: ``tools/gpu/check.sh`` runs it on one GPU in under 10 minutes.

Sections (all by default, in this order):

- ``parity``: ZeRO stages 0-3, 1-3 also with CPU offload (optimizer; stage 3 parameters too), at world 1 on the accelerator's
  backend (NCCL on a GPU), against torch.optim.AdamW on the same model and batches;
- ``kernels``: the Triton Adam/AdamW, Lion and Adagrad kernels against their pure-torch
  references on the device (needs a CUDA device);
- ``inference``: ds.inference greedy generation against transformers' on the device;
- ``bench``: step time, tokens/s and MFU of a ~1B Llama-shaped model under ds ZeRO, torch DDP
  and torch FSDP2, one after the other in this process.

Prints one table per section, writes everything as JSON (``--out``) and exits 1 when a check
failed. ``--device cpu --size tiny`` runs the same code on the CPU (gloo), as the test does.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

SECTIONS = ("parity", "kernels", "inference", "bench")
ROOT = Path(__file__).resolve().parents[2]


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
    p.add_argument("--stages", type=_ints, default=[0, 1, 2, 3], help="ZeRO stages for parity")
    p.add_argument("--parity-steps", type=_positive, default=5)
    p.add_argument("--size", choices=("1b", "tiny"), default="1b", help="benchmark model size")
    p.add_argument("--batch", type=_positive, default=4, help="benchmark micro-batch")
    p.add_argument("--seq", type=_positive, default=2048, help="benchmark sequence length")
    p.add_argument("--steps", type=_positive, default=10, help="timed benchmark steps")
    p.add_argument("--warmup", type=_positive, default=3, help="untimed benchmark steps")
    p.add_argument("--bench-stage", type=int, choices=(0, 1, 2, 3), default=2,
                   help="ZeRO stage of the ds row (world 1: stages differ in code path only)")  # fmt: skip
    p.add_argument("--systems", default="ds,torch DDP,torch FSDP2",
                   help="benchmark rows, comma-separated")  # fmt: skip
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="dense bf16 peak for MFU (default: known from the device name)")  # fmt: skip
    p.add_argument("--out", type=Path, default=ROOT / "bench-results" / "gpu_check.json")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
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
    if args.device == "cpu" and "kernels" in args.sections:
        build_parser().error("--sections kernels needs --device cuda (the Triton kernels)")
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


def run(args: argparse.Namespace) -> dict[str, Any]:
    world_one_env()
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

    accel = rank_accelerator()
    device = torch.device(accel.current_device_name())
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    report: dict[str, Any] = {
        "device": name,
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "sections": {},
    }
    print(f"device {device} ({name}), torch {torch.__version__}", flush=True)
    t0 = time.perf_counter()
    for section in args.sections:
        s0 = time.perf_counter()
        if section == "parity":
            import check_parity

            rows = check_parity.run(args.stages, args.parity_steps, device)
        elif section == "kernels":
            import check_kernels

            rows = check_kernels.run(device)
        elif section == "inference":
            import check_inference

            rows = [check_inference.run(device)]
        else:
            import check_throughput
            from models import peak_tflops

            rows = check_throughput.run(
                args.size, device, args.batch, args.seq, args.steps, args.warmup,
                args.bench_stage, peak_tflops(name, args.peak_tflops), args.systems,
            )  # fmt: skip
        report["sections"][section] = rows
        print(table(f"{section} ({time.perf_counter() - s0:.0f} s)", rows), flush=True)
    report["seconds"] = time.perf_counter() - t0
    return report


def failures(report: dict[str, Any]) -> list[str]:
    out = []
    for section, rows in report["sections"].items():
        for row in rows:
            if row.get("ok") is False or "error" in row:
                out.append(f"{section}: {json.dumps(row)}")
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    bad = failures(report)
    print(f"\n{report['seconds']:.0f} s; JSON: {args.out}")
    for line in bad:
        print(f"FAILED {line}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
