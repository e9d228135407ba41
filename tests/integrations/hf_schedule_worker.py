"""DsTrainer with a config ``scheduler`` section: prints the learning rate of every step (JSON).

python tests/integrations/hf_schedule_worker.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, TrainerCallback, TrainingArguments

from ds.integrations.hf import DsTrainer

# Run as a script: the suite's support folder is not on its path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from tiny_models import llama_shape


class Tokens(Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(7)
        self.ids = (torch.randint(0, 60, (n, 1), generator=g) + torch.arange(8)) % 64

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Rates(TrainerCallback):
    def __init__(self) -> None:
        self.rates: list[float] = []

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
        if logs and "learning_rate" in logs:
            self.rates.append(float(logs["learning_rate"]))


def main() -> None:
    torch.manual_seed(0)
    shape = llama_shape(16, 32, layers=1, heads=2, kv_heads=2, vocab=64, positions=16)
    model = LlamaForCausalLM(LlamaConfig(**shape))
    args = TrainingArguments(
        output_dir=sys.argv[1],
        per_device_train_batch_size=2,
        max_steps=6,
        learning_rate=1e-2,
        warmup_steps=4,
        lr_scheduler_type="linear",
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    ds_config = {
        "train_micro_batch_size_per_gpu": "auto",
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}},
        "scheduler": {
            "type": "WarmupLR",
            "params": {
                "warmup_min_lr": "auto",
                "warmup_max_lr": "auto",
                "warmup_num_steps": "auto",
            },
        },
        "zero_optimization": {"stage": 2},
    }
    rates = Rates()
    trainer = DsTrainer(
        model=model, args=args, train_dataset=Tokens(12), callbacks=[rates], ds_config=ds_config
    )
    trainer.train()
    print(json.dumps({"rates": rates.rates, "config": trainer.ds_config["scheduler"]}))


if __name__ == "__main__":
    main()
