"""What operators type, parsed: dead-letter addresses, durations and times, reasons (pure).

A dead letter is addressed by its task id (`summarize:01J...`) or, for any entry and the only
way for malformed ones (which have no task), by `<capability>/<stream entry id>`
(`summarize/1712345678901-0`). Durations are `500ms`, `30s`, `15m`, `2h`, `7d`, `1w` or sums
of those (`1h30m`); a point in time is such a duration back from now, or an ISO 8601 time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

from broker.durations import parse_duration_ms
from broker.errors import BadInput, InvalidTaskId
from broker.ids import check_capability, split_task_id
from broker.models import FailureReason

_ENTRY_ID_RE = re.compile(r"^[0-9]{1,20}-[0-9]{1,20}\Z")  # (\d takes any Unicode digit)
REASONS = tuple(r.value for r in FailureReason)


@dataclass(frozen=True, slots=True)
class Ref:
    """Where one dead letter is: its capability and its task id or its stream entry id."""

    capability: str
    task_id: str | None = None
    entry_id: str | None = None

    def __str__(self) -> str:
        return self.task_id if self.task_id else f"{self.capability}/{self.entry_id}"


def parse_ref(text: str) -> Ref:
    """A task id or `<capability>/<entry id>`; BadInput says what a valid one looks like."""
    if "/" in text:
        capability, _, entry_id = text.partition("/")
        try:
            check_capability(capability)
        except BadInput:
            raise BadInput(
                f"invalid dead-letter id {text!r}: {capability!r} is not a capability name"
            ) from None
        # (Each part of a stream entry id is an unsigned 64-bit number: Redis refuses more.)
        if not _ENTRY_ID_RE.match(entry_id) or any(int(p) >= 2**64 for p in entry_id.split("-")):
            raise BadInput(
                f"invalid dead-letter id {text!r}: expected '<capability>/<ms>-<seq>' "
                "(a stream entry id, as `reach dlq list` shows it)"
            )
        return Ref(capability, entry_id=entry_id)
    try:
        capability, _ = split_task_id(text)
    except InvalidTaskId:
        raise BadInput(
            f"invalid dead-letter id {text!r}: expected a task id '<capability>:<26-char id>' "
            "or '<capability>/<stream entry id>'"
        ) from None
    return Ref(capability, task_id=text)


def entry_key(entry_id: str) -> tuple[int, int]:
    """A stream entry id as a sortable pair."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def parse_time_ms(text: str, now_ms: int) -> int:
    """A duration back from `now_ms`, or an ISO 8601 time (UTC when it names no offset)."""
    try:
        return now_ms - parse_duration_ms(text)
    except BadInput:
        pass
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise BadInput(
            f"invalid time {text!r}: use a duration back from now (30m, 2h, 7d) or an ISO 8601 "
            "time (2024-05-01T12:00:00Z)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def check_reason(text: str) -> str:
    if text not in REASONS:
        raise BadInput(f"invalid reason {text!r}: use one of {', '.join(REASONS)}")
    return text


def iso_ms(ms: int | None) -> str | None:
    """Milliseconds since the epoch as ISO 8601 UTC text (None for none)."""
    if not ms:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")


def short_time(ms: int | None) -> str:
    """UTC time for tables: 2024-05-01 12:00:00 (or '-')."""
    if not ms:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def human_age(ms: int) -> str:
    """A short age for tables: 42s, 7m, 3h, 12d."""
    seconds = max(0, ms) // 1000
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def one_line(text: str | None, width: int) -> str:
    """A message on one line, cut to `width` characters with an ellipsis."""
    if not text:
        return ""
    line = " ".join(text.split())
    return line if len(line) <= width else line[: max(1, width - 1)] + "…"
