"""Rank 1 computes for SLOW_PEER_S seconds before each of 8 all-reduces: rank 0 spends most of
the job waiting in all_reduce, but in six separate calls, each shorter than the hang timeout."""

import os
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(4)
dist.all_reduce(t)  # both ranks are up
for _ in range(8):
    if dist.get_rank() == 1:
        time.sleep(float(os.environ["SLOW_PEER_S"]))
    dist.all_reduce(t)
print(f"RESULT sum={t[0].item():g}", flush=True)
dist.destroy_process_group()
