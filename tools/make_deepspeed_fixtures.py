"""Make the DeepSpeed checkpoint fixtures under tests/checkpoint/deepspeed_fixtures/.

Runs under a real DeepSpeed (0.19.8) on CPU, two ranks:

    DS_ACCELERATOR=cpu /work/dsref/bin/python -m torch.distributed.run --nproc_per_node 2 \
        tools/make_deepspeed_fixtures.py tests/checkpoint/deepspeed_fixtures [--only fp16]

(/work/dsref: a throwaway venv, never the dev one, since DeepSpeed installs its own ``ds``
script; ``DS_BUILD_OPS=0 pip install deepspeed==0.19.8`` into it, torch may come from the dev
environment through a ``.pth`` line.)

For ZeRO stages 0-3 x {fp32, bf16, fp16} it trains a tiny model 5 steps, saves a checkpoint, builds a
fresh engine (differently initialised), loads the checkpoint and trains 10 more steps, recording
DeepSpeed's own continuation: the global mean loss and learning rate of every step and the full fp32
parameters afterwards (``expected.json`` beside the checkpoint). The ds tests load each checkpoint at
other world sizes and must continue the same way. A universal checkpoint of the stage-2 fp32 run is
made with DeepSpeed's ``ds_to_universal`` when that tool runs here.

``--only fp16`` (or another precision) remakes only those cases. fp16: DeepSpeed's CPU accelerator
reports fp16 only where oneDNN has native fp16 (AVX-512 FP16 / AMX-FP16) and its engine refuses
fp16 elsewhere ("Type fp16 is not supported on your device."); torch computes fp16 on any CPU, so
for the fp16 cases this script answers that one capability query with yes. Everything else
(optimizer, loss scaler, checkpoint files) is DeepSpeed's own code, unchanged.

Everything the test needs (model, data, config) is defined in ``deepspeed_fixture_spec.py`` in the
same folder, so the test and this script cannot drift apart.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch

UNIVERSAL_SOURCE = "stage2_fp32"


def main() -> None:
    out = Path(sys.argv[1]).resolve()
    sys.path.insert(0, str(out))
    import deepspeed
    import deepspeed.comm as dist
    from deepspeed.utils import safe_get_full_fp32_param
    from deepspeed_fixture_spec import (
        CASES,
        CONTINUE_STEPS,
        FROZEN_CASES,
        GLOBAL_BATCH,
        SAVE_STEPS,
        TinyNet,
        batch,
        config,
    )

    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else None
    if only in (None, "fp16"):
        from deepspeed.accelerator import get_accelerator

        # The capability query only; see the module docstring.
        type(get_accelerator()).is_fp16_supported = lambda self: True
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == 2, "the fixtures are saved at world size 2"
    micro = GLOBAL_BATCH // world

    def engine_for(cfg: dict, seed: int):  # type: ignore[no-untyped-def]
        torch.manual_seed(seed)
        model = TinyNet()
        eng, _, _, _ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=cfg
        )
        return eng

    def train_step(eng, step: int) -> float:  # type: ignore[no-untyped-def]
        x, y = batch(step)
        x, y = x[rank * micro : (rank + 1) * micro], y[rank * micro : (rank + 1) * micro]
        dtype = next(eng.module.parameters()).dtype
        loss = eng(x.to(dtype), y.to(dtype))
        eng.backward(loss)
        eng.step()
        mean = loss.detach().float().clone()
        dist.all_reduce(mean)
        return float(mean) / world

    only_frozen = "--only-frozen" in sys.argv
    if only is None:
        for name, stage in FROZEN_CASES.items():
            _frozen_case(out / name, stage, micro, rank)
    if only_frozen:
        return
    for name, (stage, precision) in CASES.items():
        if only is not None and precision != only:
            continue
        cfg = config(stage, precision, micro)
        case_dir = out / name
        if rank == 0 and case_dir.exists():
            shutil.rmtree(case_dir)
        dist.barrier()
        eng = engine_for(cfg, seed=1234)
        for step in range(SAVE_STEPS):
            train_step(eng, step)
        client = {"epoch": 2, "note": name}
        if name == UNIVERSAL_SOURCE:  # ds_to_universal requires this key (Megatron sets it)
            client["universal_checkpoint_info"] = {"universal_checkpoint_version": 0.2}
        eng.save_checkpoint(str(case_dir), client_state=client)
        dist.barrier()
        del eng

        fresh = engine_for(cfg, seed=999)  # different weights: the load must replace them
        path, client = fresh.load_checkpoint(str(case_dir))
        assert path is not None, f"{name}: DeepSpeed could not load its own checkpoint"
        scale_loaded = _loss_scale(fresh)
        losses, lrs = [], []
        for step in range(SAVE_STEPS, SAVE_STEPS + CONTINUE_STEPS):
            losses.append(train_step(fresh, step))
            lrs.append(float(fresh.get_lr()[0]))
        params = {}
        for pname, p in fresh.module.named_parameters():
            full = safe_get_full_fp32_param(p)  # collective at stage 3
            if full is None:  # stage 0 in fp32 keeps no separate master: the weight is it
                full = p
            params[pname] = full.detach().float().reshape(-1).tolist()
        if rank == 0:
            for script in ("zero_to_fp32.py", "zero_to_torch.py"):  # DeepSpeed's copied script
                (case_dir / script).unlink(missing_ok=True)
            expected = {
                "stage": stage,
                "precision": precision,
                "saved_world_size": world,
                "global_steps": int(fresh.global_steps),
                "client_state": {k: client[k] for k in ("epoch", "note")},
                "losses": losses,
                "lrs": lrs,
                "params": params,
                "deepspeed_version": deepspeed.__version__,
            }
            if precision == "fp16":
                expected["loss_scale_loaded"] = scale_loaded
                expected["loss_scale"] = _loss_scale(fresh)
            (case_dir / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
        dist.barrier()
        del fresh

    if rank == 0 and only is None:
        _universal(out)
    dist.barrier()


def _loss_scale(eng) -> float:  # type: ignore[no-untyped-def]
    opt = eng.optimizer  # each DeepSpeed fp16 optimizer keeps the scale somewhere else
    for holder in (opt, getattr(opt, "loss_scale_config", None), getattr(opt, "loss_scaler", None)):
        scale = getattr(holder, "cur_scale", None)
        if scale is not None:
            return float(scale)
    raise AttributeError(f"no loss scale found on {type(opt).__name__}")


def _frozen_case(case_dir: Path, stage: int, micro: int, rank: int) -> None:
    """A frozen first layer: trained SAVE_STEPS steps and saved; its frozen weights are still the
    seed-1234 initial ones, which is what the export test checks."""
    import deepspeed
    import deepspeed.comm as dist
    from deepspeed_fixture_spec import SAVE_STEPS, TinyNet, batch, config

    if rank == 0 and case_dir.exists():
        shutil.rmtree(case_dir)
    dist.barrier()
    torch.manual_seed(1234)
    model = TinyNet(freeze_fc1=True)
    trainable = [p for p in model.parameters() if p.requires_grad]
    eng, _, _, _ = deepspeed.initialize(model=model, model_parameters=trainable,
                                        config=config(stage, "fp32", micro))  # fmt: skip
    for step in range(SAVE_STEPS):
        x, y = batch(step)
        loss = eng(x[rank * micro : (rank + 1) * micro], y[rank * micro : (rank + 1) * micro])
        eng.backward(loss)
        eng.step()
    eng.save_checkpoint(str(case_dir))
    dist.barrier()
    if rank == 0:
        for script in ("zero_to_fp32.py", "zero_to_torch.py"):
            (case_dir / script).unlink(missing_ok=True)
        meta = {"stage": stage, "frozen": ["fc1.weight", "fc1.bias"],
                "deepspeed_version": deepspeed.__version__}  # fmt: skip
        (case_dir / "frozen.json").write_text(json.dumps(meta, indent=1) + "\n")
    dist.barrier()


def _universal(out: Path) -> None:
    """DeepSpeed's ds_to_universal on the stage-2 fp32 checkpoint, if it runs on this machine."""
    src = out / UNIVERSAL_SOURCE
    dst = out / "universal_stage2_fp32"
    tag = (src / "latest").read_text().strip()
    if dst.exists():
        shutil.rmtree(dst)
    cmd = [
        sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal",
        "--input_folder", str(src / tag), "--output_folder", str(dst / tag),
        "--num_extract_workers", "1", "--num_merge_workers", "1",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
    if proc.returncode != 0:
        print("ds_to_universal failed; no universal fixture:\n" + proc.stderr[-3000:])
        shutil.rmtree(dst, ignore_errors=True)
        return
    (dst / "latest").write_text(tag)
    for extra in ("zero_to_fp32.py", "zero_to_torch.py"):
        (dst / tag / extra).unlink(missing_ok=True)
    shutil.copyfile(src / "expected.json", dst / "expected.json")


if __name__ == "__main__":
    main()
