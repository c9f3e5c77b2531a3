"""Reading a task's events: from its record, from its channel's messages, from the capability's
feed (pure helpers; the script replies are read in broker/protocol/lifecycle.py)."""

from __future__ import annotations

from typing import Any

from broker import codec
from broker.infra.connection import SyncRedis
from broker.keys import TASK_DONE_MESSAGE
from broker.models import TERMINAL_EVENTS, TaskEvent
from broker.protocol.trace import trace_id_of

TERMINAL_STATES = frozenset({"succeeded", "failed", "canceled"})


# Events that tell nothing about where the task is (they may follow its terminal event).
_ASIDES = frozenset({"late_result_rejected", "progress"})


def event_ends_story(event: TaskEvent, ended: bool) -> bool:
    """Whether, after `event`, the latest lifecycle event is a terminal one."""
    if event.terminal:
        return True
    return ended if event.type in _ASIDES else False


def message_is_terminal(message: str) -> bool:
    """Whether a message of a task's channel (`seq|type|...`, or `done|outcome`) tells of its
    end."""
    parts = message.split("|", 2)
    return len(parts) > 1 and (parts[1] in TERMINAL_EVENTS or message.startswith(TASK_DONE_MESSAGE))


def read_events(client: SyncRedis, task_key: str, task_id: str) -> list[TaskEvent]:
    """Every event of a task, from its record (synchronous client; [] if the record is gone)."""
    record: Any = client.hgetall(task_key)
    return events_of_record(record, task_id)


def events_of_record(record: dict[str, str], task_id: str) -> list[TaskEvent]:
    """The events a task record holds, in order."""
    out = []
    trace_id = trace_id_of(record.get("trace"))
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
    each, see flush_feed in broker/lua/_events.lua), as dicts with the fields of TaskEvent (time in
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
