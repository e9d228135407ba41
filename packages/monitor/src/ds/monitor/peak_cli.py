"""``ds bench peak``: this machine's GEMM FLOP/s per dtype and memory bandwidth, measured by torch.

Registered as the ``bench.peak`` verb in the ``ds.cli`` entry-point group. Prints a table (or the
JSON result with ``--json``) and stores the figures in the cache that MFU on a CPU reads
(``ds.monitor.ceiling``), so training runs use them without measuring again.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ds.monitor import ceiling


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ds bench peak",
        description="Measure this machine's GEMM FLOP/s per dtype and memory bandwidth (torch), "
        "print them and cache them for MFU.",
    )
    p.add_argument(
        "--threads",
        type=int,
        nargs="+",
        default=None,
        help="torch thread counts to measure at (default: this process's, "
        "then 1 when that is more)",
    )
    p.add_argument(
        "--dtypes",
        default=",".join(ceiling.DTYPES),
        help=f"comma list of {', '.join(ceiling.DTYPES)} (default: all)",
    )
    p.add_argument("--max-n", type=int, default=2048, help="largest GEMM side (default 2048)")
    p.add_argument("--mib", type=int, default=128, help="MiB per triad array (default 128)")
    p.add_argument("--repeat", type=int, default=5, help="timed repeats, median (default 5)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON result here")
    p.add_argument("--no-cache", action="store_true", help="do not store the result")
    return p


def _table(entries: list[dict]) -> str:
    dtypes = sorted({k for e in entries for k in e["flops"]}, key=list(ceiling.DTYPES).index)
    head = ["threads"] + [f"{k} GFLOP/s (n)" for k in dtypes] + ["triad GB/s"]
    rows = [head]
    for e in entries:
        row = [str(e["threads"])]
        row += [f"{e['flops'][k] / 1e9:.1f} ({e['gemm_n'][k]})" for k in dtypes]
        bw = e.get("bandwidth_bytes_per_s")
        rows.append(row + [f"{bw / 1e9:.2f}" if bw else "-"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    import torch

    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    threads = args.threads or sorted({torch.get_num_threads(), 1}, reverse=True)
    try:
        entries = [
            ceiling.measure(t, dtypes, True, args.max_n, args.mib, args.repeat) for t in threads
        ]
    except ValueError as exc:
        print(f"ds bench peak: {exc}", file=sys.stderr)
        return 2
    cached = []
    if not args.no_cache:
        cached = [ceiling.store(e) for e in entries]
    result = {
        "measured": entries,
        "cache": str(ceiling.cache_path()) if cached else None,
        "cached": cached,
        "torch": torch.__version__,
    }
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2))
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"ds bench peak: torch {torch.__version__}, this run")
    print(_table(entries))
    if cached:
        print(f"\ncached (highest measured) in {result['cache']}:")
        print(_table(cached))
    return 0


if __name__ == "__main__":
    sys.exit(main())
