"""Incremental detokenization with stop strings held back.

Streaming and non-streaming responses are both the concatenation of the pieces this produces, so
they cannot differ. Two things make naive per-token decoding wrong:

* a token can be part of a multibyte character (byte-level BPE): its decode ends in U+FFFD until
  the rest arrives, so such text is held until it completes (or the request ends);
* tokenizers join tokens (spaces, merged pieces), so ``decode(a) + decode(b) != decode([a, b])``;
  each new piece is the difference of two decodes over a short window of recent tokens (the
  prefix/read offsets vLLM uses), which costs O(1) per token.

Text that could be the start of a stop string is not released until it is known not to be one; a
completed stop string ends the request and neither it nor anything after it is returned.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

_REPLACEMENT = "\ufffd"


class IncrementalText:
    def __init__(self, decode: Callable[[list[int]], str], stops: Sequence[str] = ()) -> None:
        self._decode = decode
        self._stops = tuple(s for s in stops if s)
        self._ids: list[int] = []
        self._prefix = 0  # start of the decode window
        self._read = 0  # tokens whose text is in self.text
        self.text = ""  # all text decoded so far (cut at a stop string once one is found)
        self.sent = 0  # characters of self.text already released
        self.stopped = False

    def push(self, token: int) -> str:
        """Add a generated token; returns the text that can be released now."""
        if self.stopped:
            return ""
        self._ids.append(token)
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        if len(after) > len(before) and not after.endswith(_REPLACEMENT):
            self.text += after[len(before) :]
            self._prefix, self._read = self._read, len(self._ids)
        return self._release(final=False)

    def finish(self) -> str:
        """The request ended (length, EOS, abort): release everything still held."""
        if not self.stopped and self._read < len(self._ids):
            before = self._decode(self._ids[self._prefix : self._read])
            after = self._decode(self._ids[self._prefix :])
            self.text += after[len(before) :]
            self._read = len(self._ids)
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        if self._stops and not self.stopped:
            hits = [i for i in (self.text.find(s, self.sent) for s in self._stops) if i >= 0]
            if hits:
                self.text = self.text[: min(hits)]
                self.stopped = True
                final = True
        end = len(self.text) if final else len(self.text) - self._held_back()
        out = self.text[self.sent : end]
        self.sent = max(self.sent, end)
        return out

    def _held_back(self) -> int:
        """Length of the longest unreleased suffix that is a proper prefix of a stop string."""
        tail = self.text[self.sent :]
        best = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(tail)), best, -1):
                if tail.endswith(stop[:n]):
                    best = n
                    break
        return best
