"""A stock transformers script that only evaluates, with a ZeRO-3 DeepSpeed config and no
optimizer: transformers builds the DeepSpeed engine for inference (stage 3 partitions the model
and gathers each module's weights around its forward). No ds import.

    ds run --nproc 2 evaluate.py --output_dir OUT

Rank 0 writes OUT/result.json: the Trainer's eval_loss, the same loss from the plain model in one
process, and the engine's type.
"""

import argparse
import json
import os

import torch
from train import Tokens  # the training script's data, beside this one
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

CONFIG = {
    "train_micro_batch_size_per_gpu": "auto",
    "train_batch_size": "auto",
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
}


def make_model():
    torch.manual_seed(0)
    return LlamaForCausalLM(
        LlamaConfig(
            vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=16,
        )
    )  # fmt: skip


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--output_dir", required=True)
    cli = p.parse_args()
    model = make_model()
    data = Tokens(8)
    with torch.no_grad():  # the reference: the whole model, every row at once, before ZeRO-3
        batch = torch.stack([data[i]["input_ids"] for i in range(len(data))])
        plain = float(model(input_ids=batch, labels=batch).loss)
    args = TrainingArguments(
        output_dir=cli.output_dir,
        deepspeed=CONFIG,
        per_device_eval_batch_size=2,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, eval_dataset=data)
    metrics = trainer.evaluate()
    if trainer.is_world_process_zero():
        engine = trainer.model_wrapped
        with open(os.path.join(cli.output_dir, "result.json"), "w") as f:
            json.dump(
                {
                    "eval_loss": metrics["eval_loss"],
                    "plain_loss": plain,
                    "engine": type(engine).__module__ + "." + type(engine).__name__,
                    "optimizer": type(getattr(engine, "optimizer", None)).__name__,
                    "partitioned": all(hasattr(p, "ds_id") for p in model.parameters()),
                    "world": args.world_size,
                },
                f,
            )


if __name__ == "__main__":
    main()
