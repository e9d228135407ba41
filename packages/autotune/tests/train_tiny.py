"""A user's training script, as ``ds autotune`` runs it: a tiny transformers Llama from a local
config.json trained on random tokens until the trial ends it.

    ds run --nproc 2 train_tiny.py --model DIR --deepspeed_config ds.json [--steps N]
"""

import argparse
import json

import torch
import transformers

import ds.full as ds


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--deepspeed_config", required=True)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--seq", type=int, default=32)
    args = p.parse_args()
    with open(args.deepspeed_config) as f:
        config = json.load(f)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.AutoConfig.from_pretrained(args.model))
    engine, *_ = ds.initialize(model=model, config=config)
    micro = engine.train_micro_batch_size_per_gpu()
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(engine.global_rank)
    while engine.global_steps < args.steps:
        ids = torch.randint(0, vocab, (micro, args.seq), generator=g)
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()


if __name__ == "__main__":
    main()
