"""``deepspeed.checkpoint.ds_to_universal``: DeepSpeed converts a ZeRO checkpoint into its
"universal" per-parameter layout before loading it at another world size. ds needs no
conversion: ``engine.load_checkpoint`` reads DeepSpeed's ZeRO 1-3 checkpoints at any world size
and stage (docs/integrations.md 3.4), and ``ds checkpoint export DIR OUT`` writes the fp32
weights; so these entry points import and say so when called."""

from __future__ import annotations

from ds.full.compat.deepspeed._missing import missing_function

_FEATURE = "converting a checkpoint to DeepSpeed's universal layout"
_HINT = (
    "ds loads DeepSpeed ZeRO checkpoints at any world size directly: call "
    "engine.load_checkpoint(DIR) on the new world ('ds checkpoint export DIR OUT' writes the "
    "fp32 weights)"
)
main = missing_function("deepspeed.checkpoint.ds_to_universal.main", _FEATURE, _HINT)
parse_arguments = missing_function(
    "deepspeed.checkpoint.ds_to_universal.parse_arguments", _FEATURE, _HINT
)

__all__ = ["main", "parse_arguments"]
