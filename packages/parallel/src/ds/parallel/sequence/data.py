"""Shard each batch's sequence dimension over the sequence-parallel group.

The label shift happens once, on the full sequence, before sharding: token ``t`` predicts token
``t + 1``, and the last token of rank ``r``'s shard predicts the first token of rank ``r + 1``'s,
which only the full sequence knows. Each rank then gets the contiguous shard ``[r * n, (r+1) * n)``
of ``input_ids``, ``shift_labels`` (already shifted: feed them to
:func:`sequence_parallel_loss`, never to the model as ``labels``, which would shift again) and
``position_ids`` (global positions, so rotary embeddings are those of the full sequence).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch
import torch.nn.functional as F

from ds.interfaces.errors import ConfigError

IGNORE_INDEX = -100


def _check_right_padded(mask: torch.Tensor) -> None:
    # Right padding: every row is ones then zeros, i.e. non-increasing along the sequence.
    if mask.dim() != 2:
        raise ConfigError(
            f"attention_mask must be [batch, seq] for sequence parallelism, got {tuple(mask.shape)}"
        )
    if bool((mask[:, 1:] > mask[:, :-1]).any()):
        raise ConfigError(
            "attention_mask has padding before real tokens (left padding or holes); Ulysses "
            "attention is causal over the whole sequence and cannot mask them. Pad on the right "
            "(tokenizer.padding_side = 'right') or pack sequences without padding"
        )


def shard_batch(
    batch: Mapping[str, Any],
    sp_rank: int,
    sp_size: int,
    *,
    pad_to_multiple: bool = True,
    pad_token_id: int = 0,
) -> dict[str, Any]:
    """This rank's shard of one causal-LM batch (see the module docstring).

    ``batch`` holds ``input_ids`` ``[batch, seq]`` and optionally ``labels`` (``-100`` ignored; the
    same shape), ``attention_mask`` (right padding only; positions it masks predict nothing, and
    the mask is dropped because the model must not see it) and ``position_ids``. A sequence length
    that does not divide by ``sp_size`` is padded at the end to the next multiple (pad tokens
    ``pad_token_id``, their labels ``-100``, positions continuing) or, with
    ``pad_to_multiple=False``, refused. Other tensors shaped ``[batch, seq, ...]`` are padded with
    zeros and sharded alike; everything else passes through unchanged.
    """
    if not 0 <= sp_rank < sp_size:
        raise ConfigError(f"sp_rank={sp_rank} is outside the sequence-parallel group of {sp_size}")
    if "input_ids" not in batch:
        raise ConfigError(
            f"a sequence-parallel batch needs input_ids; got keys {sorted(batch)} "
            "(inputs_embeds batches are not supported)"
        )
    input_ids = batch["input_ids"]
    if input_ids.dim() != 2:
        raise ConfigError(f"input_ids must be [batch, seq], got {tuple(input_ids.shape)}")
    bsz, seq = input_ids.shape
    out: dict[str, Any] = {}

    labels = batch.get("labels")
    shift_labels = batch.get("shift_labels")
    if shift_labels is None and labels is not None:
        # transformers' ForCausalLMLoss: pad one -100 on the right, then drop the first column.
        shift_labels = F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]
    mask = batch.get("attention_mask")
    if mask is not None:
        _check_right_padded(mask)
        if shift_labels is not None:
            shift_labels = shift_labels.masked_fill(mask == 0, IGNORE_INDEX)
    positions = batch.get("position_ids")
    if positions is None:
        positions = torch.arange(seq, device=input_ids.device).unsqueeze(0).expand(bsz, seq)

    pad = (-seq) % sp_size
    if pad and not pad_to_multiple:
        raise ConfigError(
            f"sequence length {seq} does not divide by sequence_parallel_size={sp_size}; pad "
            f"batches to a multiple of {sp_size} (next: {seq + pad}) or let the adapter pad "
            "(pad_to_multiple=True)"
        )
    chunk = (seq + pad) // sp_size
    lo, hi = sp_rank * chunk, (sp_rank + 1) * chunk

    def cut(t: torch.Tensor, value: float) -> torch.Tensor:
        if pad:
            widths = [0, 0] * (t.dim() - 2) + [0, pad]
            t = F.pad(t, widths, value=value)
        return t[:, lo:hi].contiguous()

    out["input_ids"] = cut(input_ids, pad_token_id)
    if shift_labels is not None:
        out["shift_labels"] = cut(shift_labels, IGNORE_INDEX)
    if pad:
        tail = positions[:, -1:] + torch.arange(1, pad + 1, device=positions.device)
        positions = torch.cat([positions, tail], dim=1)
    out["position_ids"] = positions[:, lo:hi].contiguous()
    handled = {"input_ids", "labels", "shift_labels", "attention_mask", "position_ids"}
    for key, value in batch.items():
        if key in handled:
            continue
        if (
            isinstance(value, torch.Tensor)
            and value.dim() >= 2
            and tuple(value.shape[:2]) == (bsz, seq)
        ):
            out[key] = cut(value, 0)
        else:
            out[key] = value
    return out


class UlyssesDataLoaderAdapter:
    """Yields this rank's :func:`shard_batch` of each batch of ``loader``.

    Two ways to feed it:

    * default: every rank of one sequence-parallel group draws the same batches (shard the data
      over the data-parallel group only); one shard per batch.
    * ``comm`` and ``sp_group`` given (DeepSpeed's ``UlyssesSPDataLoaderAdapter``): each rank's
      loader draws its own batches (sharded over data x sequence ranks); the group's batches are
      exchanged with ``all_gather_object`` and this rank yields its shard of each in group-rank
      order, so one batch of the loader gives ``sp_size`` micro-batches. Every rank's loader must
      then yield the same number of batches.
    """

    def __init__(
        self,
        loader: Iterable[Mapping[str, Any]],
        sp_rank: int,
        sp_size: int,
        *,
        pad_to_multiple: bool = True,
        pad_token_id: int = 0,
        device: torch.device | str | None = None,
        comm: Any = None,
        sp_group: Any = None,
    ) -> None:
        if not 0 <= sp_rank < sp_size:
            raise ConfigError(
                f"sp_rank={sp_rank} is outside the sequence-parallel group of {sp_size}"
            )
        if (comm is None) != (sp_group is None):
            raise ConfigError(
                "pass both comm= and sp_group= (to gather the group's batches) or neither"
            )
        self.loader = loader
        self.sp_rank = sp_rank
        self.sp_size = sp_size
        self.pad_to_multiple = pad_to_multiple
        self.pad_token_id = pad_token_id
        self.device = None if device is None else torch.device(device)
        self.comm = comm
        self.sp_group = sp_group

    def __len__(self) -> int:
        n = len(self.loader)  # type: ignore[arg-type]
        return n * self.sp_size if self.comm is not None else n

    def _shard(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        shard = shard_batch(
            batch,
            self.sp_rank,
            self.sp_size,
            pad_to_multiple=self.pad_to_multiple,
            pad_token_id=self.pad_token_id,
        )
        if self.device is not None:
            shard = {
                k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in shard.items()
            }
        return shard

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for batch in self.loader:
            if self.comm is None:
                yield self._shard(batch)
                continue
            # Objects travel through the host; sequence lengths may differ between ranks.
            host = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
            group_batches: list[Any] = [None] * self.sp_size
            self.comm.all_gather_object(group_batches, host, group=self.sp_group)
            for other in group_batches:
                yield self._shard(other)


__all__ = ["IGNORE_INDEX", "UlyssesDataLoaderAdapter", "shard_batch"]
