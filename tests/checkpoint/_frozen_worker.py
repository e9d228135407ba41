"""Worker for test_deepspeed_frozen_load: frozen parameters come back from a checkpoint.

Run under ``ds run --nproc N``. For each ``DIR@STAGE`` given, a fresh model (other initial weights,
first layer frozen) is loaded from the checkpoint into ds ZeRO stage STAGE; rank 0 records every
parameter's full value after the load and again after one more training step. Each
``--save DIR@STAGE`` first trains a ds engine at that stage (frozen layer; at stage 3 its fragments
spread over the ranks) and saves it there, so the same loads run on ds-written checkpoints too
(``DIR@STAGE@exclude`` saves with ``exclude_frozen_parameters=True``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).with_name("deepspeed_fixtures")))

from deepspeed_fixture_spec import GLOBAL_BATCH, TinyNet, batch, config

import ds.full
import ds.zero
from ds import comm as dist


def _engine(stage: int, seed: int):  # type: ignore[no-untyped-def]
    torch.manual_seed(seed)
    model = TinyNet(freeze_fc1=True)
    cfg = config(stage, "fp32", GLOBAL_BATCH // dist.get_world_size())
    # every stage-3 parameter sharded (none kept whole), so frozen ones are per-rank fragments
    cfg["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    trainable = [p for p in model.parameters() if p.requires_grad]
    engine, *_ = ds.full.initialize(model=model, model_parameters=trainable, config=cfg)
    return engine


def _step(engine, step: int) -> None:  # type: ignore[no-untyped-def]
    rank, micro = dist.get_rank(), GLOBAL_BATCH // dist.get_world_size()
    x, y = batch(step)
    loss = engine(x[rank * micro : (rank + 1) * micro], y[rank * micro : (rank + 1) * micro])
    engine.backward(loss)
    engine.step()


def _params(engine) -> dict[str, list[float]]:  # type: ignore[no-untyped-def]
    out = {}
    for name, p in engine.module.named_parameters():
        with ds.zero.GatheredParameters([p]):
            out[name] = p.detach().float().reshape(-1).tolist()
    return out


def main() -> None:
    ds.full.init_distributed()
    args = sys.argv[2:]
    while args[0] == "--save":
        path, _, stage = args[1].partition("@")
        stage, _, exclude = stage.partition("@")  # DIR@STAGE@exclude: without frozen parameters
        engine = _engine(int(stage), seed=1234)  # frozen fc1 = the seed-1234 weights, as saved
        for step in range(3):
            _step(engine, step)
        engine.save_checkpoint(path, exclude_frozen_parameters=exclude == "exclude")
        engine.destroy()
        args = args[2:]
    results = {}
    for spec in args:
        path, _, stage = spec.partition("@")
        engine = _engine(int(stage), seed=4321)  # other weights: the load must replace them
        engine.load_checkpoint(path)
        loaded = _params(engine)
        _step(engine, 5)
        results[f"{Path(path).name}@{stage}"] = {"loaded": loaded, "stepped": _params(engine)}
        engine.destroy()
    if dist.get_rank() == 0:
        Path(sys.argv[1]).write_text(json.dumps(results))


if __name__ == "__main__":
    main()
