"""Reading a task's record: its status, its events and its outcome once it has one (pure helpers)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from broker import codec
from broker.errors import TaskCanceled, TaskFailed
from broker.models import TERMINAL_EVENTS, TaskEvent

TERMINAL_STATES = frozenset({"succeeded", "failed", "canceled"})


def outcome(task_id: str, fields: Sequence[Any]) -> tuple[bool, Any]:
    """(done, result) from (state, result, reason, error), as watch.lua returns them; raises
    TaskFailed/TaskCanceled for those ends."""
    state, result, reason, error = fields[:4]
    if state == "succeeded":
        return True, codec.loads(result) if result else None
    if state == "failed":
        raise TaskFailed(task_id, reason or "failure", error or None)
    if state == "canceled":
        raise TaskCanceled(task_id, error or None)
    return False, None


def done_outcome(task_id: str, text: str) -> tuple[bool, Any]:
    """(done, result) from the JSON a terminal script pushed to the task's done list; (False,
    None) when the result was too large to ride there (read the record then)."""
    try:
        data = codec.loads(text)
    except ValueError:
        return False, None
    if not isinstance(data, dict):
        return False, None
    state = data.get("state")
    if state == "succeeded":
        if "result" not in data:
            return False, None
        return True, data["result"]
    if state in ("failed", "canceled"):
        return outcome(task_id, (state, None, data.get("reason"), data.get("error")))
    return False, None


# Events that tell nothing about where the task is (they may follow its terminal event).
_ASIDES = frozenset({"late_result_rejected", "progress"})


def event_ends_story(event: TaskEvent, ended: bool) -> bool:
    """Whether, after `event`, the latest lifecycle event is a terminal one."""
    if event.terminal:
        return True
    return ended if event.type in _ASIDES else False


def parse_watched_events(reply: Sequence[Any]) -> tuple[str | None, int, list[TaskEvent]]:
    """(state, the task's event count, the events returned) from watch.lua's 'events' reply;
    state None when the task does not exist. Entries that do not parse are skipped."""
    if not reply or not reply[0]:
        return None, 0, []
    state, trace_id, seq, task_id = reply[0], reply[1], int(reply[2]), reply[3]
    events = []
    for i in range(4, len(reply) - 1, 2):
        try:
            events.append(TaskEvent.from_compact(int(reply[i]), reply[i + 1], task_id, trace_id))
        except ValueError:
            continue
    return state, seq, events


def message_is_terminal(message: str) -> bool:
    """Whether a message of a task's channel (`seq|type|...`) carries a terminal event."""
    parts = message.split("|", 2)
    return len(parts) > 1 and parts[1] in TERMINAL_EVENTS


def read_events(client: Any, task_key: str, task_id: str) -> list[TaskEvent]:
    """Every event of a task, from its record (synchronous client; [] if the record is gone)."""
    record = client.hgetall(task_key)
    return events_of_record(record, task_id)


def events_of_record(record: dict[str, str], task_id: str) -> list[TaskEvent]:
    """The events a task record holds, in order."""
    out = []
    trace_id = record.get("trace_id")
    for name, text in record.items():
        if name.startswith("e:") and name[2:].isdigit():
            try:
                out.append(TaskEvent.from_compact(int(name[2:]), text, task_id, trace_id))
            except ValueError:
                continue
    out.sort(key=lambda e: e.seq)
    return out


def feed_events(fields: dict[str, str]) -> list[dict[str, Any]]:
    """The events one entry of a capability's feed stream holds (one `task id|seq|event` line
    each, see flush_feed in broker/lua/_lib.lua), as dicts with the fields of TaskEvent (time in
    ms; task_id '' for events about an agent rather than a task)."""
    out = []
    for line in (fields.get("events") or "").split("\n"):
        parts = line.split("|", 6)
        if len(parts) != 7:
            continue
        task_id, seq, etype, time_ms, attempt, agent, data = parts
        try:
            parsed = codec.loads(data)
            out.append({"task_id": task_id, "seq": int(seq), "type": etype, "time": int(time_ms),
                        "attempt": int(attempt), "agent_id": agent or None,
                        "data": parsed if isinstance(parsed, dict) else {}})
        except ValueError:
            continue
    return out
