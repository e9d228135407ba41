"""Ulysses sequence parallelism: shard the sequence, all-to-all around attention.

* :func:`use_ulysses_attention` / :func:`register_ulysses_attention`: a transformers attention
  implementation (``ulysses_sdpa``, ...) wrapping a core one with the two all-to-alls.
* :class:`UlyssesDataLoaderAdapter` / :func:`shard_batch`: each rank's sequence shard of a batch,
  labels shifted once on the full sequence, global position ids.
* :func:`sequence_parallel_loss`: cross-entropy over the whole sequence's real tokens.
* :func:`apply_rotary_pos_emb`: rotary embedding on a sequence-first (``[seq, ..., dim]``) tensor.
* :class:`UlyssesAttention` (transformers layout) and :class:`DistributedAttention` (DeepSpeed's
  ``[seq, batch, heads, dim]`` contract) for models outside transformers.

All collectives go through a ``ds.interfaces.comm.Communicator`` on the SP group it is given.
"""

from ds.parallel.sequence._all_to_all import seq_all_to_all
from ds.parallel.sequence.attention import DistributedAttention, UlyssesAttention
from ds.parallel.sequence.data import IGNORE_INDEX, UlyssesDataLoaderAdapter, shard_batch
from ds.parallel.sequence.heads import check_model_config, kv_replication
from ds.parallel.sequence.hf import register_ulysses_attention, ulysses_name, use_ulysses_attention
from ds.parallel.sequence.loss import SequenceParallelLoss, sequence_parallel_loss
from ds.parallel.sequence.rotary import apply_rotary_pos_emb, rotate_half

__all__ = [
    "IGNORE_INDEX",
    "DistributedAttention",
    "SequenceParallelLoss",
    "UlyssesAttention",
    "UlyssesDataLoaderAdapter",
    "apply_rotary_pos_emb",
    "check_model_config",
    "kv_replication",
    "register_ulysses_attention",
    "rotate_half",
    "seq_all_to_all",
    "sequence_parallel_loss",
    "shard_batch",
    "ulysses_name",
    "use_ulysses_attention",
]
