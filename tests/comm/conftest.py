"""Fixtures for ds.comm multi-process tests: start real ranks as subprocesses, bounded in time."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from world import RankOutput, free_port
from world import run_ranks as start_ranks

WORKERS = Path(__file__).parent / "workers"


RankResult = RankOutput  # rank, returncode (None: killed at the deadline), stdout, stderr


def _base_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_", "OMPI_", "PMI_"))
        and not k.startswith(("SLURM_", "DS_COMM_"))
    }
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONWARNINGS"] = "error::DeprecationWarning,error::FutureWarning"
    return env


def launch(
    script: str,
    world: int,
    rank_env: list[dict[str, str]] | None = None,
    args: list[str] | None = None,
    timeout: float = 90.0,
    fresh: bool = False,
) -> list[RankResult]:
    """Run ``workers/<script>`` as ``world`` processes; kill them all at ``timeout`` seconds.

    Without ``rank_env`` each rank gets RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT.
    ``fresh``: every rank is a new interpreter (not forked from the zygote), for tests whose
    ranks must also finish the interpreter's own exit after a failed collective.
    """
    port = free_port()

    def env_of(r: int) -> dict[str, str]:
        env = _base_env()
        if rank_env is None:
            env.update(
                RANK=str(r),
                WORLD_SIZE=str(world),
                LOCAL_RANK=str(r),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
            )
        else:
            env.update({k: v.replace("{port}", str(port)) for k, v in rank_env[r].items()})
        return env

    argv = [str(WORKERS / script), *(args or [])]
    return start_ranks(
        lambda r: argv, world, timeout=timeout, env=env_of, merge_stderr=False, fork=not fresh
    )


def ok_or_report(results: list[RankResult]) -> None:
    bad = [r for r in results if r.returncode != 0]
    if bad:
        msg = "\n".join(
            f"--- rank {r.rank} rc={r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
            for r in bad
        )
        pytest.fail(f"ranks failed:\n{msg}")


@pytest.fixture(scope="session")
def run_ranks():
    return launch


def collect_checks(script: str, world: int, tmp: Path, extra: list[str] | None = None):
    """Run a checks worker; return {check name: 'ok' or the failure text} merged over ranks."""
    out = tmp / f"{script}-{world}"
    out.mkdir(parents=True, exist_ok=True)
    results = launch(script, world, args=[str(out), *(extra or [])], timeout=240)
    merged: dict[str, str] = {}
    for r in range(world):
        f = out / f"rank{r}.json"
        if not f.exists():
            rr = results[r]
            merged[f"<rank {r} crashed>"] = (
                f"rc={rr.returncode}\n{rr.stdout[-2000:]}\n{rr.stderr[-4000:]}"
            )
            continue
        for name, status in json.loads(f.read_text()).items():
            if status != "ok" or name not in merged:
                merged[name] = status if status != "ok" else merged.get(name, "ok")
    return merged
