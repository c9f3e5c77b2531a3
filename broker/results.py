"""Reading a task's record: its status, and its outcome once it has one (pure helpers)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from broker import codec
from broker.errors import TaskCanceled, TaskFailed
from broker.models import TaskEvent

# The record fields `result()` needs, in this order.
OUTCOME_FIELDS = ("state", "result", "reason", "error")
TERMINAL_STATES = frozenset({"succeeded", "failed", "canceled"})


def outcome(task_id: str, fields: Sequence[str | None]) -> tuple[bool, Any]:
    """(done, result) from OUTCOME_FIELDS values; raises TaskFailed/TaskCanceled for those ends."""
    state, result, reason, error = fields
    if state == "succeeded":
        return True, codec.loads(result) if result else None
    if state == "failed":
        raise TaskFailed(task_id, reason or "failure", error or None)
    if state == "canceled":
        raise TaskCanceled(task_id, error or None)
    return False, None


# Events that tell nothing about where the task is (they may follow its terminal event).
_ASIDES = frozenset({"late_result_rejected", "progress"})


def event_ends_story(event: TaskEvent, ended: bool) -> bool:
    """Whether, after `event`, the latest lifecycle event is a terminal one."""
    if event.terminal:
        return True
    return ended if event.type in _ASIDES else False


def parse_events(raw: Sequence[str], after_seq: int) -> list[TaskEvent]:
    """Events newer than `after_seq`, in order; entries that do not parse are skipped."""
    out = []
    for text in raw:
        try:
            event = TaskEvent.from_json(text)
        except ValueError:
            continue
        if event.seq > after_seq:
            out.append(event)
    return out
