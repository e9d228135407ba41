"""A stock transformers Trainer script with DeepSpeed, as users write it: no ds import at all.

    ds run --nproc 2 train.py --deepspeed ds_config.json --output_dir OUT [--save]

With DeepSpeed installed it trains with DeepSpeed; with ``ds compat enable`` and no DeepSpeed, the
``deepspeed`` API it reaches through transformers and accelerate is served by ds.
"""

import argparse
import json
import os

import torch
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments


class Tokens(Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(7)
        self.ids = (torch.randint(0, 60, (n, 1), generator=g) + torch.arange(8)) % 64

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Record(TrainerCallback):
    def __init__(self):
        self.losses, self.rates = [], []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.losses.append(float(logs["loss"]))
        if logs and "learning_rate" in logs:
            self.rates.append(float(logs["learning_rate"]))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--deepspeed", required=True)
    p.add_argument("--output_dir", required=True)
    p.add_argument("--save", action="store_true")
    cli = p.parse_args()
    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=16,
        )
    )  # fmt: skip
    args = TrainingArguments(
        output_dir=cli.output_dir,
        deepspeed=cli.deepspeed,
        per_device_train_batch_size=2,
        max_steps=6,
        learning_rate=1e-2,
        warmup_steps=2,
        logging_steps=1,
        save_strategy="steps" if cli.save else "no",
        save_steps=6,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    record = Record()
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(24), callbacks=[record])
    trainer.train()
    if cli.save:
        trainer.save_model(os.path.join(cli.output_dir, "final"))
    if trainer.is_world_process_zero():
        engine = trainer.model_wrapped
        with open(os.path.join(cli.output_dir, "result.json"), "w") as f:
            json.dump(
                {
                    "losses": record.losses,
                    "rates": record.rates,
                    "engine": type(engine).__module__ + "." + type(engine).__name__,
                    "world": args.world_size,
                    "steps": trainer.state.global_step,
                },
                f,
            )


if __name__ == "__main__":
    main()
