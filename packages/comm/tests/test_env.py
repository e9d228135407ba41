"""Environment discovery: launcher, OpenMPI, MPICH/Intel MPI and SLURM variables."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ds.comm.env import DistEnv, discover, expand_nodelist, first_host
from ds.interfaces.errors import ConfigError


def test_launcher_env_wins():
    env = {
        "RANK": "3",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "h0",
        "MASTER_PORT": "1234",
        "OMPI_COMM_WORLD_RANK": "0",
        "OMPI_COMM_WORLD_SIZE": "8",
    }
    assert discover(env) == DistEnv(3, 8, 1, "h0", 1234, "env")


def test_nothing_set_is_none():
    assert discover({}) is None


def test_openmpi_single_node_uses_loopback():
    env = {
        "OMPI_COMM_WORLD_RANK": "1",
        "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
    }
    assert discover(env, default_port=4000) == DistEnv(1, 4, 1, "127.0.0.1", 4000, "openmpi")


def test_openmpi_multi_node_without_master_addr_is_a_clear_error():
    env = {
        "OMPI_COMM_WORLD_RANK": "1",
        "OMPI_COMM_WORLD_SIZE": "8",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
    }
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError, match="MASTER_ADDR"):
            discover(env)
    env["MASTER_ADDR"] = "n0"
    assert discover(env).master_addr == "n0"


def test_mpich_and_intel_mpi():
    env = {"PMI_RANK": "2", "PMI_SIZE": "3", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "1"}
    env["MASTER_ADDR"] = "a"
    assert discover(env) == DistEnv(2, 3, 0, "a", 29500, "mpich")


def test_auto_mpi_discovery_off_ignores_mpi_and_slurm():
    assert discover({"PMI_RANK": "0", "PMI_SIZE": "1"}, auto_mpi_discovery=False) is None


def test_slurm_first_host_of_nodelist():
    env = {
        "SLURM_PROCID": "5",
        "SLURM_NTASKS": "16",
        "SLURM_LOCALID": "1",
        "SLURM_JOB_NODELIST": "node[01-04],gpu7",
    }
    assert discover(env) == DistEnv(5, 16, 1, "node01", 29500, "slurm")


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"RANK": "0"}, "WORLD_SIZE is not"),
        ({"WORLD_SIZE": "2"}, "RANK is not"),
        ({"RANK": "0", "WORLD_SIZE": "2"}, "MASTER_ADDR"),
        ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "x"}, "not a valid rank"),
        ({"RANK": "x", "WORLD_SIZE": "2"}, "not an integer"),
        ({"OMPI_COMM_WORLD_RANK": "0"}, "OMPI_COMM_WORLD_SIZE is not"),
        ({"PMI_SIZE": "2"}, "PMI_RANK"),
        ({"SLURM_PROCID": "0"}, "SLURM_NTASKS"),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}, "SLURM_JOB_NODELIST"),
    ],
)
def test_incomplete_env_names_what_is_missing(env, match):
    with pytest.raises(ConfigError, match=match):
        discover(env)


@pytest.mark.parametrize(
    ("nodelist", "first", "hosts"),
    [
        ("node[01-04],gpu7", "node01", ["node01", "node02", "node03", "node04", "gpu7"]),
        ("gpu7", "gpu7", ["gpu7"]),
        ("a[9-11]", "a9", ["a9", "a10", "a11"]),
        ("rack[1,3]-n[08-09]", "rack1-n08", ["rack1-n08", "rack1-n09", "rack3-n08", "rack3-n09"]),
        ("x[3,5-6],y", "x3", ["x3", "x5", "x6", "y"]),
        ("127.0.0.[1-2]", "127.0.0.1", ["127.0.0.1", "127.0.0.2"]),
    ],
)
def test_nodelist(nodelist, first, hosts):
    assert first_host(nodelist) == first
    assert expand_nodelist(nodelist) == hosts


_names = st.text(alphabet="abcdefgh", min_size=1, max_size=4)


@st.composite
def _nodelist_items(draw):
    """A SLURM host-list item and its expansion: prefix[ranges]suffix or a plain name."""
    prefix = draw(_names)
    if not draw(st.booleans()):
        return prefix, [prefix]
    width = draw(st.integers(1, 3))
    parts, hosts = [], []
    for _ in range(draw(st.integers(1, 3))):
        lo = draw(st.integers(0, 10**width - 1))
        hi = draw(st.integers(lo, min(lo + 4, 10**width - 1)))
        parts.append(f"{lo:0{width}d}" if lo == hi else f"{lo:0{width}d}-{hi:0{width}d}")
        hosts += [f"{prefix}{n:0{width}d}" for n in range(lo, hi + 1)]
    return f"{prefix}[{','.join(parts)}]", hosts


@given(st.lists(_nodelist_items(), min_size=1, max_size=4))
def test_nodelist_roundtrip(items):
    nodelist = ",".join(text for text, _ in items)
    hosts = [h for _, expanded in items for h in expanded]
    assert expand_nodelist(nodelist) == hosts
    assert first_host(nodelist) == hosts[0]
