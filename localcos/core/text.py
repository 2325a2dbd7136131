"""Generated text: incremental UTF-8 decoding, stop strings, and pieces that are final.

Tokens arrive one at a time as bytes (a token may hold part of a multi-byte character). A piece of
text is *final* once it is complete UTF-8 and can no longer turn out to be the start of a stop
string; streaming hands out only final text, so what a user sees never has to be taken back.
"""

from __future__ import annotations

import codecs
import time
from dataclasses import dataclass
from collections.abc import Callable, Sequence


@dataclass(frozen=True)
class Cursor:
    """Where a fill-in-the-middle is written, as its text needs to know (`infill.FimPrompt`):
    `healed`, the bytes of the cursor's token the prompt took back (the generation begins with
    them, constrained to; they are the prefix's, not the middle's), and `suffix`, the text after
    the cursor, where a middle that runs on into it is cut (None: no such rule, the makers'
    layout, whose model reads the suffix right after the cursor)."""

    healed: bytes = b""
    suffix: str | None = None

    @property
    def runs_into(self) -> str:
        """What of the suffix a middle that runs into it writes again: the suffix up to the end
        of its first line that is not blank, trailing white space dropped ("" where the suffix is
        blank: no cut)."""
        suffix = self.suffix or ""
        start = 0
        while start < len(suffix):
            end = suffix.find("\n", start)
            end = len(suffix) if end < 0 else end
            if suffix[start:end].strip():
                return suffix[:end].rstrip()
            start = end + 1
        return ""

    @property
    def in_block(self) -> bool:
        """Whether the suffix's first line that is not blank is indented: the code after the
        cursor goes on inside a block, which a line of the middle at the margin has left."""
        return self.runs_into.rsplit("\n", 1)[-1][:1] in (" ", "\t")  # that line ends what a middle may run into


# the rules that end a text as its own end (a finish reason "stop"); the editor's "indent" and
# "time" cut it as a length would
ENDS = ("word", "suffix", "block")


class TextAssembler:
    """Builds the completion text from token pieces and watches for what ends it: stop strings,
    and an editor's two rules (llama-server's): `indent`, a new line indented by fewer spaces or
    tabs ends the text at its first character (the code after the cursor's block is not the
    middle's), and `late()`, once true, a token holding a new line ends the text after it (the
    editor's time budget; the clock is the caller's). With a `cursor` (a middle read in the
    cached layout), its healed bytes are not the text's, and a middle that runs into the suffix
    ends where the suffix begins: once a line of the middle ends (a new line, or the end of the
    text) with the suffix's text up to its first line that is not blank (`Cursor.runs_into`,
    trailing white space aside), starting where a line starts, at the middle's start, or anywhere
    on the cursor's own line where the suffix begins inside that line, the text ends before it
    (`ended_by` "suffix"); and where the suffix goes on inside a block (`Cursor.in_block`), a new
    line of the middle that begins at the margin with text ends it at the end of its last line
    that is not blank (`ended_by` "block": the model went on past the block's end, as it does
    reading the prefix last, into the file's end or a test of it)."""

    def __init__(self, piece: Callable[[int], bytes], stop: Sequence[str] = (), *, indent: int = 0,
                 late: Callable[[], bool] | None = None, cursor: Cursor | None = None) -> None:  # fmt: skip
        self._piece = piece
        self._heal = len(cursor.healed) if cursor is not None else 0  # the healed bytes still to drop
        self._runs_into = cursor.runs_into if cursor is not None else ""
        # a suffix that begins with a new line is matched wherever a line of the middle ends; one
        # that begins with a line's text, where a line begins or on the cursor's own line
        self._at_line_end = self._runs_into.startswith("\n")
        self._in_block = cursor is not None and cursor.in_block
        self._block_scan = 0  # where `_left_block` looks for the next new line
        self._stop = [s for s in stop if s]
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._text = ""
        self._emitted = 0  # characters already handed out as final
        self.stopped = False  # the text ended: a stop string (before it), or an editor's rule
        self.ended_by: str | None = None  # "word" (a stop string, `word`), "suffix", "block", "indent" or "time"
        self.word: str | None = None
        self._hold = max((len(s) for s in self._stop), default=0)
        self._finished = False
        self._indent = indent
        self._late = late
        self._line = -1  # where the line `indent` judges next starts (-1: after the next new line)
        self._scan = 0  # where that new line is looked for

    @classmethod
    def timed(cls, piece: Callable[[int], bytes], stop: Sequence[str], indent: int, late_ms: float, started: float,
              cursor: Cursor | None = None) -> TextAssembler:  # fmt: skip
        """The text of a generation that started decoding at `started` (`time.perf_counter()`),
        late once `late_ms` milliseconds have passed (0: never)."""
        limit = late_ms / 1000
        late = (lambda: time.perf_counter() - started > limit) if limit > 0 else None
        return cls(piece, stop, indent=indent, late=late, cursor=cursor)

    @property
    def text(self) -> str:
        return self._text

    def push(self, token: int) -> bool:
        """Add a token's text; returns True if that ended the text (`ended_by` says how)."""
        if self.stopped:
            return True
        old_len = len(self._text)
        data = self._piece(token)
        if self._heal:  # the constraint made the generation begin with the healed bytes: not the middle's
            cut = min(self._heal, len(data))
            data, self._heal = data[cut:], self._heal - cut
        piece = self._decoder.decode(data)
        self._text += piece
        if self._stop:
            start = max(0, old_len - self._hold + 1)
            hits = [(i, s) for s in self._stop if (i := self._text.find(s, start)) != -1]
            if hits:
                at, self.word = min(hits)
                self._end(at, "word")
                return True
        if self._runs_into:
            newline = self._text.find("\n", old_len)
            while newline >= 0:
                if self._ran_into_suffix(newline):
                    return True
                newline = self._text.find("\n", newline + 1)
        if self._in_block and self._left_block():
            return True
        if self._indent > 0 and self._outdented():
            return True
        if self._late is not None and "\n" in piece and self._late():
            self._end(len(self._text), "time")
        return self.stopped

    def _outdented(self) -> bool:
        """Whether a line after a new line starts with fewer than `indent` spaces or tabs before
        its first other character (a new line included: a blank line ends the text too, as in
        llama-server): the text then ends there, that line's leading white space kept."""
        text = self._text
        while True:
            if self._line < 0:
                newline = text.find("\n", self._scan)
                if newline < 0:
                    self._scan = len(text)
                    return False
                self._line = self._scan = newline + 1
            at = self._line
            while at < len(text) and text[at] in " \t":
                at += 1
            if at == len(text):
                return False  # the line's first character is still to come
            if at - self._line < self._indent:
                self._end(at, "indent")
                return True
            self._line, self._scan = -1, at  # judged: the next new line opens the next line to judge

    def _left_block(self) -> bool:
        """Whether a line after a new line begins at the margin with text (blank lines aside):
        the text then ends at the end of the last line before it that is not blank."""
        text = self._text
        newline = text.find("\n", self._block_scan)
        while newline >= 0 and newline + 1 < len(text):
            if text[newline + 1] not in " \t\r\n":
                self._end(len(text[: newline + 1].rstrip()), "block")
                return True
            newline = text.find("\n", newline + 1)
        self._block_scan = len(text) if newline < 0 else newline  # a new line at the end: judged with what follows
        return False

    def _ran_into_suffix(self, end: int) -> bool:
        """Whether the line that ends at `end` ends with what of the suffix a middle that runs
        into it writes again, from where it may begin (see the class); if so the text ends there."""
        line = self._text[:end].rstrip(" \t\r")
        if not line.endswith(self._runs_into):
            return False
        at = len(line) - len(self._runs_into)
        if self._at_line_end or self._text[at - 1 : at] == "\n" or "\n" not in self._text[:at]:
            self._end(at, "suffix")
            return True
        return False

    def _end(self, at: int, why: str) -> None:
        self._text = self._text[:at]
        self.stopped = True
        self.ended_by = why

    def finish(self) -> None:
        """No more tokens: flush an incomplete UTF-8 tail (as U+FFFD) unless a stop string ended the text."""
        if not self.stopped:
            self._text += self._decoder.decode(b"", final=True)
            if self._runs_into:
                self._ran_into_suffix(len(self._text))
        self._finished = True

    def take_final(self) -> str:
        """Text that became final since the last call."""
        end = len(self._text)
        if self._stop and not (self.stopped or self._finished):
            end = self._safe_end()
        if self._runs_into and not (self.stopped or self._finished):
            # a middle that runs into the suffix is cut at most that far before the line it is on
            end = min(end, max(0, self._text.rfind("\n") + 1 - len(self._runs_into)))
        if self._in_block and not (self.stopped or self._finished):
            end = min(end, len(self._text.rstrip()))  # the block's end drops the blank lines before it
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
