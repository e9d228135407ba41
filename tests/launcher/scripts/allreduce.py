"""Each rank all-reduces (rank + 1) with gloo and prints what it saw."""

import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print(
    f"RESULT rank={dist.get_rank()} world={dist.get_world_size()} sum={t.item():g} "
    f"local={os.environ['LOCAL_RANK']} local_world={os.environ['LOCAL_WORLD_SIZE']} "
    f"node={os.environ['NODE_RANK']} omp={os.environ['OMP_NUM_THREADS']} "
    f"threads={torch.get_num_threads()} foo={os.environ.get('FOO', '-')} "
    f"envfile={os.environ.get('FROM_ENV_FILE', '-')}",
    flush=True,
)
dist.destroy_process_group()
