"""Rank environment under MPI or SLURM: ``python -m ds.launcher.rankenv -- CMD ...``.

mpirun, mpiexec, mpirun_rsh and srun start every rank themselves and describe it in their own
variables (OMPI_COMM_WORLD_*, PMI_*, MV2_COMM_WORLD_*, SLURM_*). This shim translates them into the
torch.distributed variables (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, NODE_RANK), sets the
per-rank thread count, and replaces itself with the user command, so a plain torch script runs
unchanged under every runner.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping

# (rank, world size, local rank, local world size) variables, in order of preference.
_SCHEMES: tuple[tuple[str, str, str, str], ...] = (
    (
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
    ),
    (
        "MV2_COMM_WORLD_RANK",
        "MV2_COMM_WORLD_SIZE",
        "MV2_COMM_WORLD_LOCAL_RANK",
        "MV2_COMM_WORLD_LOCAL_SIZE",
    ),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("PMIX_RANK", "PMIX_SIZE", "PMIX_LOCAL_RANK", "PMIX_LOCAL_SIZE"),
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"),
)


def translate(environ: Mapping[str, str], cores: int) -> dict[str, str]:
    """The variables to add for the rank described by ``environ`` (empty when none is found)."""
    for rank_k, size_k, lrank_k, lsize_k in _SCHEMES:
        if rank_k in environ and size_k in environ:
            rank, size = int(environ[rank_k]), int(environ[size_k])
            lrank = int(environ.get(lrank_k, "0"))
            lsize_text = environ.get(lsize_k, "1").split("(")[0].split(",")[0]
            lsize = int(lsize_text) if lsize_text.isdigit() else 1
            out = {
                "RANK": str(rank),
                "WORLD_SIZE": str(size),
                "LOCAL_RANK": str(lrank),
                "LOCAL_WORLD_SIZE": str(lsize),
            }
            node = environ.get("SLURM_NODEID")
            out["NODE_RANK"] = node if node is not None else str(rank // max(1, lsize))
            out["CROSS_RANK"] = out["NODE_RANK"]
            out.setdefault("OMP_NUM_THREADS", str(max(1, cores // max(1, lsize))))
            return out
    return {}


def apply(environ: MutableMapping[str, str], cores: int) -> None:
    for key, value in translate(environ, cores).items():
        if key == "OMP_NUM_THREADS" and key in environ:
            continue  # a thread count the user exported explicitly wins
        environ[key] = value


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "--":
        args = args[1:]
    if not args:
        print("usage: python -m ds.launcher.rankenv -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    apply(os.environ, len(os.sched_getaffinity(0)))
    try:
        os.execvp(args[0], args)
    except OSError as exc:
        print(f"ds.launcher.rankenv: cannot run {args[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127
    return 0  # pragma: no cover - execvp does not return


if __name__ == "__main__":
    sys.exit(main())
