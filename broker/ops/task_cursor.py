"""Where a task search stands (pure): every candidate has a position, and a page's cursor is
the position of the last candidate it looked at.

A position is (score, capability, tie): the score is a time in ms (when the task was submitted,
or failed, or was canceled, depending on where the search looks), the tie orders candidates of
one capability with the same score (a task's local id in a zset, a stream entry's sequence
number in the DLQ). Searches run newest first: from the highest position down, capabilities
merged, so a cursor means the same thing whichever capability it came from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from broker.errors import BadInput
from broker.ids import CAPABILITY_RE

_CURSOR_RE = re.compile(r"^(\d{1,16}):([^:]{1,64}):([0-9A-Za-z]{1,32})\Z")


@dataclass(frozen=True, slots=True, order=True)
class Position:
    score: int
    capability: str
    tie: str

    def encode(self) -> str:
        return f"{self.score}:{self.capability}:{self.tie}"


def decode_cursor(text: str) -> Position:
    """A cursor as a page gave it; BadInput for anything else."""
    match = _CURSOR_RE.match(text.strip())
    if not match or not CAPABILITY_RE.match(match.group(2)):
        raise BadInput(f"invalid cursor {text[:80]!r}: pass back the next_cursor a page gave")
    return Position(int(match.group(1)), match.group(2), match.group(3))


def is_after(candidate: Position, cursor: Position | None) -> bool:
    """Whether `candidate` comes after `cursor` in a newest-first walk (strictly below it)."""
    return cursor is None or candidate < cursor


def zset_start(capability: str, cursor: Position | None) -> tuple[int | None, bool]:
    """Where a walk of one capability's zset starts: (highest score, inclusive); None: the top.

    Of the entries with exactly the cursor's score, those of capabilities ordered before the
    cursor's come after it (inclusive); those ordered after it came before (exclusive); in the
    cursor's own capability the tie decides (inclusive, then `is_after` filters)."""
    if cursor is None:
        return None, True
    return cursor.score, capability <= cursor.capability


def stream_start(capability: str, cursor: Position | None) -> str:
    """The XREVRANGE end (an id) where a walk of one capability's stream starts."""
    if cursor is None:
        return "+"
    if capability < cursor.capability:
        return str(cursor.score)  # (every sequence number of that ms)
    if capability > cursor.capability:
        return str(cursor.score - 1) if cursor.score > 0 else "0-0"
    if not cursor.tie.isdigit():  # (a cursor from a zset walk: resume below its ms)
        return str(cursor.score - 1) if cursor.score > 0 else "0-0"
    return f"({cursor.score}-{int(cursor.tie)}"


SEQ_WIDTH = 20
"""A stream sequence number as a tie: zero-padded, so that text order is number order."""


def stream_tie(entry_id: str) -> tuple[int, str]:
    """(ms, tie) of a stream entry id `ms-seq`."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), seq.zfill(SEQ_WIDTH)
