"""Check that DeepSpeed 0.19.8 resumes from ds checkpoints converted to its layout.

    .venv/bin/python tools/check_deepspeed_roundtrip.py WORK_DIR \
        --deepspeed-python /tmp/ds_suite/venv-deepspeed/bin/python

For ZeRO 0, 1 and 2 in fp32 and bf16, ds trains the DeepSpeed-fixture model (tests/checkpoint/
deepspeed_fixtures) 5 steps at world 1, saves a ds tag, records its own next 5 losses, and writes
the tag in DeepSpeed's layout for data-parallel sizes 1 and 2 (``ds checkpoint export --format
deepspeed``). Then the real DeepSpeed (CPU accelerator, torch Adam; run through
``torch.distributed.run`` at each size) builds the same model and config with other initial
weights, ``load_checkpoint``s the converted tag, trains the same 5 global batches and compares its
losses with ds's; its ``zero_to_fp32`` must return ds's fp32 master weights exactly, and its
``ds_to_universal`` the ds tag's weights and Adam moments (stage 2, fp32, size 2). Prints the
largest differences; exits non-zero past 1e-6 (fp32) or 1e-2 (bf16 losses). Not part of the test
suite: DeepSpeed is not installed in ds's environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "checkpoint" / "deepspeed_fixtures"))

CASES = [(0, "fp32"), (1, "fp32"), (2, "fp32"), (0, "bf16"), (1, "bf16"), (2, "bf16")]
WORLDS = (1, 2)
SAVE, CONTINUE = 5, 5
TOLERANCE = {"fp32": 1e-6, "bf16": 1e-2}


def _name(stage: int, precision: str) -> str:
    return f"stage{stage}_{precision}"


def run_ds(work: Path) -> None:
    """Under ds: train, save, continue (recorded), convert at every world size."""
    import torch
    from deepspeed_fixture_spec import GLOBAL_BATCH, TinyNet, batch, config

    import ds.full
    from ds.checkpoint.cli import main as checkpoint_cli

    for stage, precision in CASES:
        name = _name(stage, precision)
        torch.manual_seed(1234)
        eng, *_ = ds.full.initialize(model=TinyNet(), config=config(stage, precision, GLOBAL_BATCH))
        dtype = next(eng.module.parameters()).dtype
        losses = []
        for step in range(SAVE + CONTINUE):
            if step == SAVE:
                eng.save_checkpoint(str(work / name / "ds"), client_state={"epoch": 2})
            x, y = batch(step)
            loss = eng(x.to(dtype), y.to(dtype))
            eng.backward(loss)
            eng.step()
            losses.append(float(loss.detach().float()))
        for world in WORLDS:
            dst = work / name / f"deepspeed_w{world}"
            argv = ["export", "--format", "deepspeed", str(work / name / "ds"), str(dst)]
            assert checkpoint_cli(argv + ["--world-size", str(world)]) == 0
        (work / name / "ds_losses.json").write_text(json.dumps(losses[SAVE:]))


def run_deepspeed(work: Path) -> None:
    """Under DeepSpeed (one process per rank): load each converted tag and continue."""
    import deepspeed
    import deepspeed.comm as dist
    import torch
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    from deepspeed_fixture_spec import GLOBAL_BATCH, TinyNet, batch, config

    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    micro = GLOBAL_BATCH // world
    report = {}
    for stage, precision in CASES:
        name = _name(stage, precision)
        src = work / name / f"deepspeed_w{world}"
        torch.manual_seed(999)  # other weights: the load must replace them
        model = TinyNet()
        eng, *_ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=config(stage, precision, micro)
        )
        path, client = eng.load_checkpoint(str(src))
        assert path is not None and client["epoch"] == 2, (name, path, client)
        assert eng.global_steps == SAVE, eng.global_steps
        dtype = next(eng.module.parameters()).dtype
        losses = []
        for step in range(SAVE, SAVE + CONTINUE):
            x, y = batch(step)
            x, y = x[rank * micro : (rank + 1) * micro], y[rank * micro : (rank + 1) * micro]
            loss = eng(x.to(dtype), y.to(dtype))
            eng.backward(loss)
            eng.step()
            mean = loss.detach().float().clone()
            dist.all_reduce(mean)
            losses.append(float(mean) / world)
        if rank == 0:
            ds_losses = json.loads((work / name / "ds_losses.json").read_text())
            ck = torch.load(str(work / name / "masters.pt"), weights_only=True)
            # zero_to_fp32 reads ZeRO partitions; a stage-0 tag has none (as DeepSpeed's own)
            masters = get_fp32_state_dict_from_zero_checkpoint(str(src)) if stage else ck
            report[name] = {
                "loss_diff": max(abs(a - b) for a, b in zip(losses, ds_losses, strict=True)),
                "zero_to_fp32_equal": all(torch.equal(masters[n], t) for n, t in ck.items()),
                "losses": losses,
                "ds_losses": ds_losses,
            }
        del eng
    if rank == 0:
        (work / f"deepspeed_w{world}.json").write_text(json.dumps(report, indent=1))


def _save_masters(work: Path) -> None:
    """ds's fp32 masters of each saved tag, for comparing with DeepSpeed's zero_to_fp32."""
    import torch

    from ds.checkpoint.deepspeed_export import iter_state_dict

    for stage, precision in CASES:
        name = _name(stage, precision)
        masters = dict(iter_state_dict(str(work / name / "ds")))
        torch.save(masters, str(work / name / "masters.pt"))


def _check_universal(work: Path, python: str, env: dict[str, str]) -> bool:
    """DeepSpeed's ds_to_universal on a converted tag: every parameter's fp32 weights and Adam
    moments must equal the ds tag's."""
    import torch

    from ds.checkpoint.engine import ShardedCheckpointEngine
    from ds.checkpoint.sharding import full_requests

    name = _name(2, "fp32")
    src, out = work / name / "deepspeed_w2" / f"global_step{SAVE}", work / name / "universal"
    cmd = [python, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder", str(src),
           "--output_folder", str(out), "--inject_missing_state"]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        print(proc.stdout[-2000:], proc.stderr[-3000:])
        return False
    eng = ShardedCheckpointEngine()
    metas = eng.metadata(str(work / name / "ds"))
    ref = eng.load(str(work / name / "ds"), None, full_requests(metas.values())).tensors
    same = True
    for key, prefix in (("fp32", "module"), ("exp_avg", "optim.exp_avg"),
                        ("exp_avg_sq", "optim.exp_avg_sq")):  # fmt: skip
        for n in (k[len(prefix) + 1 :] for k in ref if k.startswith(f"{prefix}.")):
            t = torch.load(str(out / "zero" / n / f"{key}.pt"), weights_only=False)
            t = t["param"] if isinstance(t, dict) else t
            same &= torch.equal(t.reshape(-1), ref[f"{prefix}.{n}"].local.reshape(-1))
    print(f"{name} world 2 -> DeepSpeed ds_to_universal: fp32 and Adam moments == ds tag: {same}")
    return same


def main() -> int:
    work = Path(sys.argv[1]).resolve()
    if "--role" in sys.argv:
        run_deepspeed(work)
        return 0
    python = sys.argv[sys.argv.index("--deepspeed-python") + 1]
    work.mkdir(parents=True, exist_ok=True)
    run_ds(work)
    _save_masters(work)
    env = dict(os.environ, DS_ACCELERATOR="cpu", PYTHONPATH="", OMP_NUM_THREADS="1")
    failed = False
    for world in WORLDS:
        cmd = [python, "-m", "torch.distributed.run", "--nproc_per_node", str(world),
               "--master_port", str(29611 + world), __file__, str(work), "--role", "deepspeed"]  # fmt: skip
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            print(proc.stdout[-3000:], proc.stderr[-5000:])
            return 1
        for name, r in json.loads((work / f"deepspeed_w{world}.json").read_text()).items():
            tol = TOLERANCE[name.rpartition("_")[2]]
            ok = r["loss_diff"] <= tol and r["zero_to_fp32_equal"]
            failed |= not ok
            print(f"{name} world {world}: max |loss - ds loss| = {r['loss_diff']:.3e}, "
                  f"zero_to_fp32 == ds masters: {r['zero_to_fp32_equal'] if 'stage0' not in name else 'n/a'} "
                  f"{'OK' if ok else 'FAIL'}")  # fmt: skip
    failed |= not _check_universal(work, python, env)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
