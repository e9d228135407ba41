"""Sequence sharding of batches: label shift on the full sequence, positions, padding, errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from ds.interfaces.errors import ConfigError
from ds.parallel.sequence import IGNORE_INDEX, UlyssesDataLoaderAdapter, shard_batch


def _batch(seq: int = 8, bsz: int = 2) -> dict[str, torch.Tensor]:
    ids = torch.arange(1, bsz * seq + 1).reshape(bsz, seq)
    return {"input_ids": ids, "labels": ids.clone()}


def _all(batch: dict, sp: int, **kw: object) -> list[dict]:
    return [shard_batch(batch, r, sp, **kw) for r in range(sp)]


def test_shards_are_contiguous_and_labels_shift_once_on_full_sequence() -> None:
    batch = _batch(8)
    shards = _all(batch, 4)
    ids = torch.cat([s["input_ids"] for s in shards], dim=1)
    assert torch.equal(ids, batch["input_ids"])
    assert [s["input_ids"].shape for s in shards] == [torch.Size([2, 2])] * 4
    assert torch.equal(shards[1]["input_ids"], batch["input_ids"][:, 2:4])
    # the last token of rank 0 predicts the first token of rank 1
    assert torch.equal(shards[0]["shift_labels"][:, -1], batch["input_ids"][:, 2])
    shifted = torch.cat([s["shift_labels"] for s in shards], dim=1)
    assert torch.equal(shifted, F.pad(batch["labels"], (0, 1), value=IGNORE_INDEX)[..., 1:])
    assert (shards[-1]["shift_labels"][:, -1] == IGNORE_INDEX).all()
    # labels are removed so the model never shifts them a second time
    assert all("labels" not in s for s in shards)


def test_position_ids_are_global() -> None:
    shards = _all(_batch(8), 2)
    assert torch.equal(shards[0]["position_ids"], torch.arange(4).expand(2, 4))
    assert torch.equal(shards[1]["position_ids"], torch.arange(4, 8).expand(2, 4))
    given = torch.tensor([[0, 1, 2, 0, 1, 2], [5, 6, 7, 8, 9, 10]])
    batch = {"input_ids": torch.ones(2, 6, dtype=torch.long), "position_ids": given}
    assert torch.equal(shard_batch(batch, 1, 2)["position_ids"], given[:, 3:])


def test_length_not_divisible_is_padded_with_ignored_labels() -> None:
    batch = _batch(7)
    shards = _all(batch, 2, pad_token_id=0)
    assert [s["input_ids"].shape[1] for s in shards] == [4, 4]
    assert (shards[1]["input_ids"][:, -1] == 0).all()
    assert (shards[1]["shift_labels"][:, -2:] == IGNORE_INDEX).all()
    assert torch.equal(shards[1]["position_ids"][0], torch.tensor([4, 5, 6, 7]))
    real = sum(int((s["shift_labels"] != IGNORE_INDEX).sum()) for s in shards)
    assert real == 2 * 6  # seq 7 -> 6 predictions per row, none for padding


def test_length_not_divisible_refused_with_numbers_when_padding_is_off() -> None:
    with pytest.raises(ConfigError, match=r"sequence length 7 .*sequence_parallel_size=3.*next: 9"):
        shard_batch(_batch(7), 0, 3, pad_to_multiple=False)


def test_right_padding_predicts_nothing_and_mask_is_dropped() -> None:
    batch = _batch(6)
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, 3:] = 0
    batch["attention_mask"] = mask
    shards = _all(batch, 2)
    assert all("attention_mask" not in s for s in shards)
    full = torch.cat([s["shift_labels"] for s in shards], dim=1)
    assert (full[1, 3:] == IGNORE_INDEX).all()
    assert torch.equal(full[1, :2], batch["input_ids"][1, 1:3])


def test_left_padding_refused() -> None:
    batch = _batch(6)
    batch["attention_mask"] = torch.tensor([[1] * 6, [0, 0, 1, 1, 1, 1]])
    with pytest.raises(ConfigError, match="padding_side = 'right'"):
        shard_batch(batch, 0, 2)


def test_other_per_token_tensors_are_sharded_and_the_rest_passes() -> None:
    batch = _batch(4)
    batch["token_type_ids"] = torch.arange(8).reshape(2, 4)
    batch["sample_weight"] = torch.tensor([1.0, 2.0])
    s = shard_batch(batch, 1, 2)
    assert torch.equal(s["token_type_ids"], torch.tensor([[2, 3], [6, 7]]))
    assert s["sample_weight"] is batch["sample_weight"]


def test_no_labels_gives_no_shift_labels() -> None:
    s = shard_batch({"input_ids": torch.ones(1, 4, dtype=torch.long)}, 0, 2)
    assert "shift_labels" not in s


@pytest.mark.parametrize(
    ("batch", "rank", "sp", "match"),
    [
        ({"inputs_embeds": torch.ones(1, 2, 3)}, 0, 2, "needs input_ids"),
        ({"input_ids": torch.ones(4, dtype=torch.long)}, 0, 2, r"\[batch, seq\]"),
        ({"input_ids": torch.ones(1, 4, dtype=torch.long)}, 2, 2, "sp_rank=2 is outside"),
    ],
)
def test_bad_batches(batch: dict, rank: int, sp: int, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        shard_batch(batch, rank, sp)


def test_adapter_over_a_dataloader() -> None:
    rows = [
        {"input_ids": torch.arange(i, i + 6), "labels": torch.arange(i, i + 6)} for i in range(4)
    ]
    loader = DataLoader(rows, batch_size=2)
    adapter = UlyssesDataLoaderAdapter(loader, sp_rank=1, sp_size=2, device="cpu")
    assert len(adapter) == 2
    out = list(adapter)
    assert len(out) == 2
    assert torch.equal(out[0]["input_ids"], torch.tensor([[3, 4, 5], [4, 5, 6]]))
    assert torch.equal(out[1]["shift_labels"][:, -1], torch.tensor([-100, -100]))
    with pytest.raises(ConfigError, match="sp_rank=-1"):
        UlyssesDataLoaderAdapter(loader, sp_rank=-1, sp_size=2)
    with pytest.raises(ConfigError, match="both comm= and sp_group="):
        UlyssesDataLoaderAdapter(loader, sp_rank=0, sp_size=2, sp_group=object())
