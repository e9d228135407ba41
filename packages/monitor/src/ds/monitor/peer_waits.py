"""Who waited for whom: every rank's exposed collective wait per step, compared across ranks.

At a blocking collective every rank waits until the last one arrives, then for the transfer. So
the rank that arrives last waits least: its wait is the collectives' own cost (the floor), and
what any rank waited beyond the floor is time it spent waiting for a peer. A rank's own numbers
cannot tell the two apart (a tiny model's gloo all-reduce is a large share of its step without
anyone being late); the comparison can, and it names the late rank.

Each rank writes ``step gather_wait sync_wait`` to the job's key-value store (the one
torch.distributed rendezvoused through) as its step ends, in one of a few rotating slots. The
comparing rank reads the previous step's slot of every rank as its own step ends: by then every
peer has written it, since none can finish this step's collectives before writing the previous
step (so the read never blocks, and the comparison lags the step by one). A step whose slot does
not hold that step for every rank (a rank that publishes no metrics) is not compared.

Ranks are compared on their mean wait over the last ``HORIZON`` compared steps: on a shared,
loaded machine the scheduler delays each rank in turn, and that noise cancels in the means, while
a rank that is late step after step stays late. The first step compared is not counted: the
ranks' start-up (imports, building the model) ends at different times.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

_PREFIX = "ds_gate/waits"
_SLOTS = 4
HORIZON = 10


@dataclass(frozen=True)
class Comparison:
    """One step, all ranks: the stall beyond the collectives' own cost, and who caused it."""

    step: int
    gather_stall_s: float  # the most any rank waited on peers in parameter gathers (mean)
    sync_stall_s: float  # ... in gradient synchronisation
    late_rank: int  # the rank that waited least: it arrived last


class PeerWaits:
    def __init__(self, store: Any, rank: int, world_size: int, compare: bool) -> None:
        self.store = store
        self.rank = rank
        self.world_size = world_size
        self.compare = compare  # the rank whose assessment is recorded compares
        self._recent: deque[tuple[list[float], list[float]]] = deque(maxlen=HORIZON)
        self._warm = False  # the first step (start-up skew between ranks) is not compared

    def _key(self, step: int, rank: int) -> str:
        return f"{_PREFIX}/{step % _SLOTS}/{rank}"

    def publish(self, step: int, gather_s: float, sync_s: float) -> None:
        self.store.set(self._key(step, self.rank), f"{step} {gather_s!r} {sync_s!r}")

    def compare_previous(self, step: int) -> Comparison | None:
        """The comparison of ``step - 1`` (None when some rank has not written it)."""
        if not self.compare or step < 1:
            return None
        prev = step - 1
        keys = [self._key(prev, r) for r in range(self.world_size)]
        if not self.store.check(keys):
            return None
        rows = [bytes(v).decode().split() for v in self.store.multi_get(keys)]
        if any(int(row[0]) != prev for row in rows):
            return None
        if not self._warm:
            self._warm = True
            return None
        self._recent.append(([float(row[1]) for row in rows], [float(row[2]) for row in rows]))
        n = len(self._recent)
        gather = [sum(g[r] for g, _ in self._recent) / n for r in range(self.world_size)]
        sync = [sum(s[r] for _, s in self._recent) / n for r in range(self.world_size)]
        total = [g + s for g, s in zip(gather, sync, strict=True)]
        late = min(range(self.world_size), key=total.__getitem__)
        return Comparison(
            prev, max(gather) - min(gather), max(sync) - min(sync), late if max(total) > 0 else -1
        )
