from __future__ import annotations

import pytest

from ds.launcher.rankenv import apply, translate


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {
                "OMPI_COMM_WORLD_RANK": "3",
                "OMPI_COMM_WORLD_SIZE": "4",
                "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
            },
            ("3", "4", "1", "2", "1"),
        ),
        (
            {"PMI_RANK": "2", "PMI_SIZE": "6", "MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "3"},
            ("2", "6", "2", "3", "0"),
        ),
        (
            {
                "MV2_COMM_WORLD_RANK": "5",
                "MV2_COMM_WORLD_SIZE": "8",
                "MV2_COMM_WORLD_LOCAL_RANK": "1",
                "MV2_COMM_WORLD_LOCAL_SIZE": "4",
            },
            ("5", "8", "1", "4", "1"),
        ),
        (
            {
                "SLURM_PROCID": "5",
                "SLURM_NTASKS": "8",
                "SLURM_LOCALID": "1",
                "SLURM_NTASKS_PER_NODE": "4",
                "SLURM_NODEID": "1",
            },
            ("5", "8", "1", "4", "1"),
        ),
    ],
)
def test_translate(env: dict[str, str], expected: tuple[str, ...]) -> None:
    out = translate(env, cores=8)
    got = (
        out["RANK"],
        out["WORLD_SIZE"],
        out["LOCAL_RANK"],
        out["LOCAL_WORLD_SIZE"],
        out["NODE_RANK"],
    )
    assert got == expected
    assert out["OMP_NUM_THREADS"] == str(8 // int(expected[3]))


def test_translate_nothing_outside_mpi() -> None:
    assert translate({"HOME": "/root"}, cores=4) == {}


def test_apply_keeps_user_thread_count() -> None:
    env = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "OMP_NUM_THREADS": "7"}
    apply(env, cores=8)
    assert env["OMP_NUM_THREADS"] == "7"
    assert env["RANK"] == "0"
