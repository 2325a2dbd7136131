"""Generated text: incremental UTF-8 decoding, stop strings, and pieces that are final.

Tokens arrive one at a time as bytes (a token may hold part of a multi-byte character). A piece of
text is *final* once it is complete UTF-8 and can no longer turn out to be the start of a stop
string; streaming hands out only final text, so what a user sees never has to be taken back.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Sequence


class TextAssembler:
    """Builds the completion text from token pieces and watches for stop strings."""

    def __init__(self, piece: Callable[[int], bytes], stop: Sequence[str] = ()) -> None:
        self._piece = piece
        self._stop = [s for s in stop if s]
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._text = ""
        self._emitted = 0  # characters already handed out as final
        self.stopped = False  # a stop string was found; text ends before it
        self._hold = max((len(s) for s in self._stop), default=0)
        self._finished = False

    @property
    def text(self) -> str:
        return self._text

    def push(self, token: int) -> bool:
        """Add a token's text; returns True if that completed a stop string."""
        if self.stopped:
            return True
        old_len = len(self._text)
        self._text += self._decoder.decode(self._piece(token))
        if self._stop:
            start = max(0, old_len - self._hold + 1)
            hits = [i for s in self._stop if (i := self._text.find(s, start)) != -1]
            if hits:
                self._text = self._text[: min(hits)]
                self.stopped = True
        return self.stopped

    def finish(self) -> None:
        """No more tokens: flush an incomplete UTF-8 tail (as U+FFFD) unless a stop string ended the text."""
        if not self.stopped:
            self._text += self._decoder.decode(b"", final=True)
        self._finished = True

    def take_final(self) -> str:
        """Text that became final since the last call."""
        end = len(self._text)
        if self._stop and not (self.stopped or self._finished):
            end = self._safe_end()
        piece = self._text[self._emitted : end]
        self._emitted = max(self._emitted, end)
        return piece

    def _safe_end(self) -> int:
        """Length of the prefix that no stop string can still extend into."""
        text = self._text
        for k in range(min(self._hold - 1, len(text)), 0, -1):
            tail = text[-k:]
            if any(s.startswith(tail) for s in self._stop):
                return len(text) - k
        return len(text)
