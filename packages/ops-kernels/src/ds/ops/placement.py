"""Where optimizer state lives in memory, so the fused kernels stream it at full speed.

An optimizer step walks several large buffers in lockstep (param, grad, and one or two moments).
When two of them start at virtual addresses that are equal modulo a large power of two, every
step of the walk touches both at congruent addresses, and the walk slows down for every
implementation alike, not only ds's (measured on this project's x86-64 machine, one thread, 50M
fp16 elements, docs/benchmarks.md): four buffers congruent modulo 256 MiB took 2.8x the time of
the same kernel on buffers 64 KiB or more apart; congruence modulo 32-128 MiB cost 1.2-1.7x; a
single congruent pair (param and grad, or grad and second moment) 1.5-1.6x. Congruence modulo
16 MiB or less cost nothing measurable, nor did a congruent pair moved 32 KiB or more apart.
Large tensors come from ``mmap`` at page granularity, so such congruences are not rare: a freed
hole of the right size puts a new tensor exactly ``2**k`` bytes away from an old one.

The state tensors are the ones an optimizer allocates itself, so it can choose their addresses:
``zeros_apart`` keeps a plain allocation when it is at least :data:`MIN_GAP` away, modulo
:data:`PERIOD`, from every buffer it will be walked with; otherwise it over-allocates by a few
64 KiB slots and returns the view at the first slot that is.
Parameters and gradients belong to the caller; :func:`congruent_pairs` reports when two of them
alias, which is what ``tools/bench/optim.py`` prints next to its timings.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# Congruence modulo 32 MiB or any larger power of two was measured to slow the walk; staying
# MIN_GAP away modulo 32 MiB stays away modulo all of them.
PERIOD = 32 << 20
# 32 KiB apart already ran at full speed; twice that leaves margin.
MIN_GAP = 64 << 10
# Below this a tensor is allocated plainly: the slowdown was measured on large buffers, and the
# padding would no longer be small next to the tensor.
MIN_BYTES = 2 << 20


def _distance(a: int, b: int) -> int:
    d = (a - b) % PERIOD
    return min(d, PERIOD - d)


def _big(t: torch.Tensor) -> bool:
    return t.device.type == "cpu" and t.numel() * t.element_size() >= MIN_BYTES


def _checked_avoid(fn: str, avoid: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    # A tensor is itself a sequence: iterating a large one element by element would build
    # millions of scalar tensors before failing somewhere else. Taken as a tuple once, so a
    # generator is read only once.
    if isinstance(avoid, torch.Tensor):
        raise TypeError(f"{fn}: avoid must be a list of tensors, got one tensor; pass [tensor]")
    out = tuple(avoid)
    for t in out:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{fn}: avoid must hold tensors, got {type(t).__name__}")
    return out


def congruent_pairs(
    named: Sequence[tuple[str, torch.Tensor]], gap: int = MIN_GAP
) -> list[tuple[str, str]]:
    """Pairs of large CPU tensors whose data start less than ``gap`` bytes apart modulo
    :data:`PERIOD` (the placement that slows a lockstep walk over both). ``named`` holds
    ``(name, tensor)`` pairs."""
    if isinstance(named, torch.Tensor):
        raise TypeError("congruent_pairs: expected (name, tensor) pairs, got one tensor")
    for item in named:
        if not (
            isinstance(item, tuple)
            and len(item) == 2
            and isinstance(item[0], str)
            and isinstance(item[1], torch.Tensor)
        ):
            raise TypeError(
                "congruent_pairs: expected (name, tensor) pairs, e.g. [('param', p), "
                f"('grad', g)], got an item of type {type(item).__name__}"
            )
    big = [(n, t) for n, t in named if _big(t)]
    out = []
    for i, (na, a) in enumerate(big):
        for nb, b in big[i + 1 :]:
            if _distance(a.data_ptr(), b.data_ptr()) < gap:
                out.append((na, nb))
    return out


def _empty_apart(
    shape: Sequence[int] | torch.Size,
    dtype: torch.dtype,
    avoid: Sequence[torch.Tensor],
    fn: str,
) -> torch.Tensor:
    """Uninitialised contiguous CPU tensor, placed as :func:`zeros_apart` describes; ``fn`` names
    the public caller in errors."""
    avoid = _checked_avoid(fn, avoid)
    shape = tuple(int(s) for s in shape)
    numel = 1
    for s in shape:
        numel *= s
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    others = [t.data_ptr() for t in avoid if _big(t)]
    if nbytes < MIN_BYTES or not others:
        return torch.empty(shape, dtype=dtype)
    if 2 * len(others) + 1 > PERIOD // MIN_GAP:
        raise ValueError(
            f"{fn}: {len(others)} large tensors to avoid; at most "
            f"{(PERIOD // MIN_GAP - 1) // 2} can be (pass only the buffers walked with this one)"
        )
    # Usually the plain allocation already lies apart (each address to avoid rules out 128 KiB
    # of the 32 MiB period): then it is kept, with no padding.
    plain = torch.empty(shape, dtype=dtype)
    if all(_distance(plain.data_ptr(), o) >= MIN_GAP for o in others):
        return plain
    del plain
    # Each address to avoid rules out an open arc of 2 * MIN_GAP: at most two of the candidate
    # offsets, which are MIN_GAP apart, so 2 * len(others) + 1 candidates always leave one free.
    slots = 2 * len(others) + 1
    raw = torch.empty(nbytes + (slots - 1) * MIN_GAP, dtype=torch.uint8)
    base = raw.data_ptr()
    for k in range(slots):
        off = k * MIN_GAP
        if all(_distance(base + off, o) >= MIN_GAP for o in others):
            break
    else:  # unreachable by the counting argument above; kept so a bug cannot go unnoticed
        raise AssertionError("no free placement slot")
    return raw[off : off + nbytes].view(dtype).view(shape)


def zeros_apart(
    shape: Sequence[int] | torch.Size,
    dtype: torch.dtype,
    avoid: Sequence[torch.Tensor] = (),
    fill: float = 0.0,
) -> torch.Tensor:
    """A contiguous CPU tensor filled with ``fill``, placed at least :data:`MIN_GAP` bytes away,
    modulo :data:`PERIOD`, from the data of every large tensor in ``avoid``.

    Small tensors (under :data:`MIN_BYTES`) are allocated plainly, and so is any tensor whose
    plain allocation already lies apart (the common case). Otherwise the tensor is a view into a
    storage up to ``2 * len(avoid) * MIN_GAP`` bytes larger than its data (384 KiB for three
    buffers to avoid), which ``torch.save`` writes whole.
    """
    return _empty_apart(shape, dtype, avoid, "zeros_apart").fill_(fill)


def placed_copy(src: torch.Tensor, avoid: Sequence[torch.Tensor] = ()) -> torch.Tensor:
    """A contiguous CPU copy of ``src`` placed like :func:`zeros_apart` (state restored from a
    checkpoint keeps the placement of freshly created state)."""
    return _empty_apart(src.shape, src.dtype, avoid, "placed_copy").copy_(src)
