"""Ulysses building blocks on a real gloo world (SP=2), without transformers."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _sp_launch import run_ranks

WORKER = Path(__file__).resolve().parent / "_sp_layer_worker.py"
TOL = 1e-5


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("sp-layer")
    run_ranks(WORKER, 2, [], [str(out)], timeout=60)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.multiprocess
@pytest.mark.parametrize("case", ["ds_layout", "hf_kv2", "hf_kv1"])
def test_attention_matches_full_sequence(ranks: list[dict[str, Any]], case: str) -> None:
    for r in ranks:
        assert r[case]["out_rel"] < TOL, r[case]
        assert r[case]["grad_rel"] < TOL, r[case]


@pytest.mark.multiprocess
def test_local_mask_refused_with_the_needed_shape(ranks: list[dict[str, Any]]) -> None:
    msg = ranks[0]["hf_kv2"]["mask_error"]
    assert "(2, 1, 4, 4)" in msg and "[batch, 1, 8, 8]" in msg


@pytest.mark.multiprocess
def test_loss_counts_real_tokens_of_whole_sequence(ranks: list[dict[str, Any]]) -> None:
    for r in ranks:
        assert r["loss"]["global_rel"] < TOL
        assert r["loss"]["sum_over_sp_rel"] < TOL
        assert r["loss"]["num_tokens"] == 7
    assert ranks[1]["loss"]["local_loss"] == 0.0  # no real token on rank 1: zero, not NaN


@pytest.mark.multiprocess
def test_adapter_gathers_each_ranks_batches_in_deepspeed_mode(ranks: list[dict[str, Any]]) -> None:
    for r in ranks:
        assert r["gathered_loader"] == {"ok": True, "yielded": 4}
