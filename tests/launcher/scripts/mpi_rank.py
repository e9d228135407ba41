"""A rank started by mpirun: checks that the MPI variables and RANK/WORLD_SIZE agree, discovers
itself through ds.comm (when installed) and all-reduces over gloo."""

import os
import sys

import torch

ompi_rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
ompi_size = int(os.environ["OMPI_COMM_WORLD_SIZE"])
assert int(os.environ["RANK"]) == ompi_rank, (os.environ["RANK"], ompi_rank)
assert int(os.environ["WORLD_SIZE"]) == ompi_size
assert int(os.environ["LOCAL_RANK"]) == int(os.environ["OMPI_COMM_WORLD_LOCAL_RANK"])
try:
    from ds import comm as dist
    from ds.comm.env import discover

    # Discovery from the MPI variables alone must agree with what the launcher exported.
    mpi_only = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    }
    found = discover(mpi_only)
    assert found is not None and found.source == "openmpi", found
    via = "ds.comm"
    dist.init_distributed(dist_backend="gloo")
except ImportError:
    import torch.distributed as dist  # type: ignore[no-redef]

    found = None
    via = "torch.distributed"
    dist.init_process_group("gloo")
if found is not None:
    assert (found.rank, found.world_size) == (ompi_rank, ompi_size), found
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
# One write per line: under `python -u` print() issues the text and the newline as two writes,
# which mpirun may interleave with another rank's output.
sys.stdout.write(
    f"MPIRESULT rank={dist.get_rank()} world={dist.get_world_size()} sum={t.item():g} "
    f"via={via} discovered={'yes' if found is not None else 'n/a'}\n"
)
sys.stdout.flush()
# Tear the group down before exit: gloo threads alive at interpreter shutdown can abort the rank.
dist.barrier()
dist.destroy_process_group()
