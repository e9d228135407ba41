"""What a rank writes in a save: its shard state checked, and the byte layout of its shard file
(tensors by name, each 64-byte aligned), staged to host memory for asynchronous saves."""

from __future__ import annotations

from typing import Any

import torch

from ds.checkpoint import _format as fmt
from ds.checkpoint._reader import dtype_name
from ds.interfaces.checkpoint import ShardedStateDict
from ds.interfaces.errors import CheckpointError


def validate_state(state: ShardedStateDict) -> None:
    for key, st in state.tensors.items():
        if key != st.meta.name:
            raise CheckpointError(f"state.tensors[{key!r}] holds a shard of {st.meta.name!r}")
        if st.local.dim() != 1:
            raise CheckpointError(
                f"shard of {key!r} must be 1-D (flattened elements), got shape {list(st.local.shape)}"
            )
        if dtype_name(st.local.dtype) != st.meta.dtype:
            raise CheckpointError(
                f"shard of {key!r} has dtype {dtype_name(st.local.dtype)}, meta says {st.meta.dtype}"
            )
        if st.offset < 0 or st.stop > st.meta.numel:
            raise CheckpointError(
                f"shard of {key!r} covers [{st.offset}, {st.stop}) outside its {st.meta.numel} "
                "elements"
            )


def shard_layout(
    state: ShardedStateDict, staging: dict[str, torch.Tensor] | None
) -> tuple[list[tuple[int, torch.Tensor]], dict[str, dict[str, Any]]]:
    """Byte layout of this rank's shard file: tensors by name, each 64-byte aligned.

    With ``staging`` (asynchronous saves) every shard is copied to host memory first, into the
    buffer of the same name when one of the same size and dtype is there, so the caller may keep
    training while the copy is written.
    """
    pieces: list[tuple[int, torch.Tensor]] = []
    layout: dict[str, dict[str, Any]] = {}
    pos = 0
    for name in sorted(state.tensors):
        st = state.tensors[name]
        local = st.local.detach()
        if staging is not None:
            buf = staging.get(name)
            if buf is None or buf.numel() != local.numel() or buf.dtype != local.dtype:
                buf = torch.empty(local.numel(), dtype=local.dtype)
                staging[name] = buf
            buf.copy_(local.reshape(-1))
            local = buf
        elif local.device.type != "cpu":
            local = local.to("cpu")
        local = local.contiguous()
        raw = local.view(torch.uint8) if local.numel() else torch.empty(0, dtype=torch.uint8)
        pos = fmt.align_up(pos)
        pieces.append((pos, raw))
        layout[name] = {
            "shape": list(st.meta.shape),
            "dtype": st.meta.dtype,
            "offset": st.offset,
            "numel": int(local.numel()),
            "byte_offset": pos,
        }
        pos += int(raw.numel())
    for stale in set(staging or ()) - set(state.tensors):
        del staging[stale]  # type: ignore[union-attr]
    return pieces, layout


__all__ = ["shard_layout", "validate_state"]
