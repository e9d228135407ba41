"""Progress of long checkpoint work: a tqdm bar on a terminal, otherwise (logs, CI) one line per
tenth of the work and one at the end.

``Progress(label, total, unit)`` is called with the amount just done. With ``after_s`` set it stays
silent until that many seconds have passed, so the many small saves of a run print nothing and
only a save long enough to make a user wonder shows where it is.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import IO, Any

__all__ = ["Progress"]


class Progress:
    def __init__(
        self,
        label: str,
        total: int,
        unit: str = "tensors",
        *,
        after_s: float = 0.0,
        stream: IO[str] | None = None,
        clock: Any = time.monotonic,
    ) -> None:
        self.label, self.total, self.unit = label, max(0, int(total)), unit
        self.after_s = after_s
        self.stream = stream if stream is not None else sys.stderr
        self.clock = clock
        self.start = clock()
        self.done = 0
        self._tenth = 0  # tenths of the total already reported off a terminal
        self._bar: Any = None
        self._shown = False
        self._lock = threading.Lock()  # async saves report from their writer thread

    def _line(self) -> str:
        if self.unit != "B":
            return f"{self.label}: {self.done}/{self.total} {self.unit}"
        mib = 2**20
        pct = 100 * self.done // self.total if self.total else 100
        elapsed = max(self.clock() - self.start, 1e-9)
        return (
            f"{self.label}: {self.done / mib:.1f}/{self.total / mib:.1f} MiB ({pct}%, "
            f"{self.done / mib / elapsed:.0f} MiB/s)"
        )

    def __call__(self, amount: int = 1) -> None:
        with self._lock:
            self.done = min(self.total, self.done + int(amount))
            if not self._shown:
                if self.clock() - self.start < self.after_s:
                    return  # short so far (or done before it was long): nothing to show
                self._shown = True
                if self.stream.isatty():
                    self._open_bar()
            if self._bar is not None:
                self._bar.n = self.done
                self._bar.refresh()
                if self.done >= self.total:
                    self._bar.close()
                return
            tenth = 10 * self.done // self.total if self.total else 10
            if tenth > self._tenth:
                self._tenth = tenth
                print(self._line(), file=self.stream, flush=True)

    def _open_bar(self) -> None:
        from tqdm import tqdm  # type: ignore[import-untyped]

        kw: dict[str, Any] = {"unit": self.unit}
        if self.unit == "B":
            kw.update(unit_scale=True, unit_divisor=1024)
        self._bar = tqdm(total=self.total, desc=self.label, file=self.stream, **kw)
        self._bar.n = self.done
