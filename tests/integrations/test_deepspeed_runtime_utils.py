"""``deepspeed.runtime.utils``: prefix sums, DeepSpeed's balanced partition and PartitionedTensor."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch

from ds.full.compat.deepspeed.runtime import utils


def test_prefix_sum_and_balanced_partition_follow_deepspeed() -> None:
    assert utils.prefix_sum_inc([3, 4, 5]) == [3, 7, 12]
    # The smallest spread between the heaviest and the lightest part, ties to the later cut.
    assert utils.partition_balanced([0, 1, 2, 3, 3, 3], 4) == [0, 3, 4, 5, 6]
    assert utils.partition_balanced([0.0, 1.1, 1.9, 3.0, 3.0, 3.0], 4) == [0, 3, 4, 5, 6]
    assert utils.partition_balanced([0.0, 1.1, 30, 3.0], 3) == [0, 2, 3, 4]
    assert utils.partition_balanced([1] * 8, 4) == [0, 2, 4, 6, 8]
    assert utils.partition_balanced([1, 1], 4) == [0, 1, 2, 2, 2]  # fewer items than parts


def test_count_used_parameters_in_backward() -> None:
    used, unused = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    params = [*used.parameters(), *unused.parameters()]
    seen: list[int] = []
    used.weight.register_hook(
        lambda g: seen.append(utils.count_used_parameters_in_backward(params))
    )
    used(torch.ones(1, 2)).sum().backward()
    assert seen == [2]  # used's weight and bias; unused is not in this backward
    with pytest.raises(RuntimeError, match="during a backward"):
        utils.count_used_parameters_in_backward(params)


_RANK = textwrap.dedent(
    """
    import json, os, sys
    import torch
    import ds.comm as dist
    from ds.full.compat.deepspeed.runtime.utils import PartitionedTensor

    os.environ.update(RANK=sys.argv[1], LOCAL_RANK=sys.argv[1], WORLD_SIZE="2")
    dist.init_distributed(dist_backend="gloo")
    out = []
    for rows, cols in ((4, 3), (5, 3)):  # an even and an uneven split over 2 ranks
        torch.manual_seed(rows)
        full = torch.rand(rows, cols)
        part = PartitionedTensor(full, group=None)
        again = PartitionedTensor.from_meta(part.to_meta(), part.data(), None)
        out.append([part.local_size()[0], torch.equal(part.full(), full),
                    torch.equal(again.full(), full)])
    dist.destroy_process_group()
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)
    """
)


def test_partitioned_tensor_is_whole_again_on_every_rank(tmp_path: Path) -> None:
    from world import run_script

    script = tmp_path / "rank.py"
    script.write_text(_RANK)
    run_script(script, 2, lambda r, _: [str(r), str(tmp_path / f"{r}.json")], timeout=120)
    results = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(2)]
    assert all(whole and again for result in results for _, whole, again in result)
    # 12 values split 6 + 6; 15 split 8 + 7
    assert [[size for size, _, _ in result] for result in results] == [[6, 8], [6, 7]]
