"""The causal-LM loss of a sequence-parallel rank, normalised over the whole sequence."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from ds.parallel.sequence.data import IGNORE_INDEX


class SequenceParallelLoss(NamedTuple):
    loss: torch.Tensor
    """Backpropagate this one (``engine.backward(result.loss)``)."""
    global_loss: torch.Tensor | None
    """The detached loss of the whole sequence (what single-process transformers reports)."""
    num_tokens: torch.Tensor
    """Real tokens in the whole sequence (all SP ranks)."""


def sequence_parallel_loss(
    logits: torch.Tensor,
    shift_labels: torch.Tensor,
    comm: Any,
    sp_group: Any,
    *,
    ignore_index: int = IGNORE_INDEX,
    report_global: bool = True,
) -> SequenceParallelLoss:
    """Cross-entropy of this rank's tokens, scaled so SP training equals single-process training.

    ``loss = sum(CE over this rank's real tokens) / N * sp_size`` where ``N`` is the real-token
    count of the whole sequence (``shift_labels != ignore_index``, all-reduced over ``sp_group``).
    Summed over the group, ``sum / N`` is exactly transformers' mean over the full sequence. The
    factor ``sp_size`` is there because ZeRO averages gradients over the ``dp_sp`` group (see
    ``ds.interfaces.parallel``): the SP ranks' gradients, which together make the gradient of the
    group's summed loss, are divided by ``sp_size`` in that average. Without an engine, all-reduce
    the gradients over the SP group with AVG for the same result.

    ``global_loss`` (detached, one more small all-reduce; ``report_global=False`` skips it) is the
    full-sequence loss for logging. No value is read back to the host. A sequence with no real
    tokens gives 0.
    """
    sp = int(comm.get_world_size(sp_group))
    vocab = logits.shape[-1]
    labels = shift_labels.reshape(-1).to(logits.device)
    # fp32 like transformers' ForCausalLMLoss (logits.float()).
    summed = F.cross_entropy(
        logits.reshape(-1, vocab).float(), labels, ignore_index=ignore_index, reduction="sum"
    )
    count = (labels != ignore_index).sum()
    comm.all_reduce(count, group=sp_group)
    denom = count.clamp(min=1).to(summed.dtype)
    loss = summed / denom * sp
    global_loss = None
    if report_global:
        global_loss = (summed.detach() / denom).clone()
        comm.all_reduce(global_loss, group=sp_group)
    return SequenceParallelLoss(loss, global_loss, count)


__all__ = ["SequenceParallelLoss", "sequence_parallel_loss"]
