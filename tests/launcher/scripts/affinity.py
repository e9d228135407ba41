import os

print(
    f"CPUS rank={os.environ['RANK']} cpus={sorted(os.sched_getaffinity(0))} "
    f"omp={os.environ['OMP_NUM_THREADS']} "
    f"visible={os.environ.get('CUDA_VISIBLE_DEVICES', '-')}",
    flush=True,
)
