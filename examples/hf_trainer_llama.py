"""Fine-tune a tiny random Llama with the Transformers Trainer on the ds engine.

    ds run --nproc 2 examples/hf_trainer_llama.py --stage 3 --output-dir out

``--plain`` runs the stock ``Trainer`` instead (the single-process reference). ``--losses FILE``
writes the logged per-step losses (rank 0); the trained model is saved to ``OUTPUT_DIR/model`` as
a normal Transformers checkpoint directory.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import torch
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

from ds.integrations.hf import DsTrainer

SEQ = 16


def tiny_llama(hidden: int = 32, layers: int = 2) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=96,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


class Tokens(Dataset):
    """Random token sequences with a learnable pattern (each token predicts the next)."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(7)
        start = torch.randint(0, 90, (n, 1), generator=g)
        self.ids = (start + torch.arange(SEQ)) % 96

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class LossLog(TrainerCallback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
        if logs and "loss" in logs:
            self.losses.append(float(logs["loss"]))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--stage", type=int, default=2)
    p.add_argument("--plain", action="store_true", help="stock Trainer (reference run)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--global-batch", type=int, default=4)
    p.add_argument("--accumulate", type=int, default=1)
    p.add_argument("--output-dir", default="hf_out")
    p.add_argument("--losses", default=None)
    p.add_argument("--save-steps", type=int, default=0, help="write checkpoint-N dirs every N")
    p.add_argument("--resume", default=None, help="a checkpoint-N directory to resume from")
    p.add_argument("--hidden", type=int, default=32, help="model width (benchmarks use more)")
    p.add_argument("--layers", type=int, default=2)
    args = p.parse_args()

    world = int(os.environ.get("WORLD_SIZE", "1"))
    micro = args.global_batch // (world * args.accumulate)
    targs = TrainingArguments(
        output_dir=args.output_dir,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=args.accumulate,
        max_steps=args.steps,
        learning_rate=3e-3,
        weight_decay=0.01,
        max_grad_norm=1.0,
        lr_scheduler_type="linear",
        warmup_steps=2,
        logging_steps=1,
        save_strategy="steps" if args.save_steps else "no",
        save_steps=args.save_steps or 500,
        report_to=[],
        use_cpu=True,
        seed=0,
        dataloader_drop_last=True,
        disable_tqdm=True,
    )
    model = tiny_llama(args.hidden, args.layers)
    log = LossLog()
    data = Tokens(args.steps * args.global_batch)
    if args.plain:
        trainer: Trainer = Trainer(model=model, args=targs, train_dataset=data, callbacks=[log])
    else:
        ds_config = {
            "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": "auto",
            "train_batch_size": "auto",
            "gradient_clipping": "auto",
            "zero_optimization": {"stage": args.stage},
        }
        trainer = DsTrainer(
            model=model, args=targs, train_dataset=data, callbacks=[log], ds_config=ds_config
        )
    result = trainer.train(resume_from_checkpoint=args.resume)
    trainer.save_model(os.path.join(args.output_dir, "model"))
    if args.losses and trainer.is_world_process_zero():
        engine = getattr(trainer, "engine", None)
        report = {
            "losses": log.losses,
            "engine": None if engine is None else type(engine).__name__,
            "zero_stage": None if engine is None else engine.zero_optimization_stage(),
            "world_size": world,
            "train_runtime_s": float(result.metrics["train_runtime"]),
            "steps": int(result.global_step),
        }
        with open(args.losses, "w") as f:
            json.dump(report, f)
    if torch.distributed.is_initialized():
        # Leave together: a rank that exits while another still talks to it aborts the job.
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
