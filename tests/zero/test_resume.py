"""Checkpoints through the CheckpointEngine: stop at step 15, resume, reach step 30 bit-identical
to an uninterrupted run; the same checkpoint loads into another stage and another world size."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _launch import run_world

from conftest import scenario

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.timeout(420)]


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


def test_resume_is_bit_identical(tmp_path_factory: pytest.TempPathFactory) -> None:
    r = scenario("resume", tmp_path_factory)
    assert r["steps_after_load"] == 15
    assert r["client_state"] == {"epoch": 3}
    assert r["path"].endswith("global_step15")
    assert _equal(r["at15"], r["loaded15"])
    assert _equal(r["full"], r["resumed"])
    assert not _equal(r["at15"], r["resumed"])  # it did train after loading


def test_checkpoint_loads_into_another_stage(tmp_path_factory: pytest.TempPathFactory) -> None:
    r = scenario("resume", tmp_path_factory)
    assert _equal(r["at15"], r["other_stage_loaded"])


def test_checkpoint_reshards_to_three_ranks(tmp_path_factory: pytest.TempPathFactory) -> None:
    r = scenario("resume", tmp_path_factory)
    src = next(Path(p) for p in tmp_path_factory.getbasetemp().glob("zero-resume-2*/ckpt"))
    out = tmp_path_factory.mktemp("zero-reshard-3")
    got = run_world("reshard", 3, out, 240.0, str(src))
    assert _equal(r["at15"], got["loaded"])
    assert got["global_steps"] == 16
