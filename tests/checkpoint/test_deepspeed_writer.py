"""ds tags written in DeepSpeed's layout (``ds checkpoint export --format deepspeed``) hold the same
training state, and an engine resumes from them as from the ds tag.

A tiny model trains 3 steps under ds (ZeRO 0, 1 and 2, fp32 and bf16, Adam) and is saved; the tag is
converted for data-parallel sizes 1 and 2. ds's DeepSpeed reader must find every logical tensor
(weights, fp32 masters, Adam moments) equal bit for bit and the same step, counters, LR scheduler
and client state; a ds engine loading the converted tag (ds's DeepSpeed-load route) continues with
the losses of one loading the ds tag (1e-6). That real DeepSpeed resumes from these files is
checked by tools/check_deepspeed_roundtrip.py (DeepSpeed is not installed here).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).with_name("deepspeed_fixtures")))
from deepspeed_fixture_spec import GLOBAL_BATCH, TinyNet, batch, config

import ds.full
from ds.checkpoint.cli import main as checkpoint_cli
from ds.checkpoint.deepspeed_format import DeepSpeedCheckpoint
from ds.checkpoint.engine import ShardedCheckpointEngine
from ds.checkpoint.sharding import full_requests

CASES = [(0, "fp32"), (1, "fp32"), (2, "fp32"), (0, "bf16"), (1, "bf16"), (2, "bf16")]
SAVE, CONTINUE = 3, 3


def _engine(stage: int, precision: str, seed: int):  # type: ignore[no-untyped-def]
    torch.manual_seed(seed)
    engine, *_ = ds.full.initialize(model=TinyNet(), config=config(stage, precision, GLOBAL_BATCH))
    return engine


def _train(engine, steps: range) -> list[float]:  # type: ignore[no-untyped-def]
    dtype = next(engine.module.parameters()).dtype
    losses = []
    for step in steps:
        x, y = batch(step)
        loss = engine(x.to(dtype), y.to(dtype))
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach().float()))
    return losses


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[int, str], Path]:
    root = tmp_path_factory.mktemp("ds_tags")
    out = {}
    env = dict(os.environ)
    try:
        for stage, precision in CASES:
            engine = _engine(stage, precision, seed=1234)
            _train(engine, range(SAVE))
            out[(stage, precision)] = root / f"stage{stage}_{precision}"
            engine.save_checkpoint(str(out[(stage, precision)]), client_state={"epoch": 2})
    finally:
        # The world of one ds.initialize started (and its rendezvous variables) must not outlive
        # this module's setup: the per-test cleanup does not see a group a module fixture made.
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        os.environ.clear()
        os.environ.update(env)
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"stage{c[0]}_{c[1]}")
def test_converted_tag_holds_the_ds_tag_state_bit_for_bit(
    case: tuple[int, str], saved: dict[tuple[int, str], Path], tmp_path: Path
) -> None:
    src = saved[case]
    eng = ShardedCheckpointEngine()
    metas = eng.metadata(str(src))
    ref = eng.load(str(src), None, full_requests(metas.values()))
    for world in (1, 2):
        dst = tmp_path / f"w{world}"
        argv = ["export", "--format", "deepspeed", str(src), str(dst), "--world-size", str(world)]
        assert checkpoint_cli(argv) == 0
        prefix = "bf16_" if case[1] == "bf16" else ""
        ranks = range(world) if case[0] else []  # stage 0: all in the model states
        assert sorted(p.name for p in (dst / f"global_step{SAVE}").iterdir()) == sorted(
            ["mp_rank_00_model_states.pt"]
            + [f"{prefix}zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in ranks]
        )
        ck = DeepSpeedCheckpoint(str(dst))
        assert (ck.stage, ck.world_size) == (case[0], world)
        assert sorted(ck.tensors) == sorted(ref.tensors)
        for name, t in ref.tensors.items():
            got = ck.tensors[name].read(0, t.meta.numel)
            assert got.dtype == t.local.dtype, name
            assert torch.equal(got.reshape(-1), t.local.reshape(-1)), name
        for key in ("step", "global_steps", "global_samples", "skipped_steps", "lr_scheduler",
                    "client_state", "optimizer.scalar_state"):  # fmt: skip
            assert ck.objects[key] == ref.objects[key], key
        for saved_group, got_group in zip(
            ref.objects["optimizer.param_groups"], ck.objects["optimizer.param_groups"], strict=True
        ):
            assert {k: saved_group[k] for k in got_group} == got_group


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"stage{c[0]}_{c[1]}")
def test_engine_resumes_from_the_converted_tag_as_from_the_ds_tag(
    case: tuple[int, str], saved: dict[tuple[int, str], Path], tmp_path: Path
) -> None:
    from ds.checkpoint.deepspeed_writer import write_deepspeed

    src = saved[case]
    dst = tmp_path / "deepspeed"
    write_deepspeed(str(src), str(dst), world_size=2, model=TinyNet())  # order from the model
    losses = {}
    for name, path in (("ds", src), ("deepspeed", dst)):
        engine = _engine(*case, seed=999)  # other weights: the load must replace them
        loaded, client = engine.load_checkpoint(str(path))
        assert loaded is not None and client == {"epoch": 2}
        assert engine.global_steps == SAVE
        losses[name] = _train(engine, range(SAVE, SAVE + CONTINUE))
    torch.testing.assert_close(losses["deepspeed"], losses["ds"], rtol=0, atol=1e-6)
