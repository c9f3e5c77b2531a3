"""A Reach task as an A2A Task, read from its record: its status as its events up to a point
say (so a subscriber's first event matches the position it resumes from), the message it came
from as its history, its result as an artifact once it succeeded."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from a2a.types import Task

from broker import codec
from broker.client.events import events_of_record
from broker.errors import BadInput
from broker.ids import split_task_id
from broker.keys import CapabilityKeys
from gateway.a2a import mapping
from gateway.state import GatewayState


@dataclass(frozen=True, slots=True)
class Snapshot:
    task: Task
    status: mapping.Status

    @property
    def ended(self) -> bool:
        return self.status.state in mapping.TERMINAL


class Snapshots:
    def __init__(self, gw: GatewayState) -> None:
        self.gw = gw

    def _key(self, task_id: str) -> str | None:
        try:
            capability, local = split_task_id(task_id)
        except (ValueError, BadInput):
            return None
        return CapabilityKeys(self.gw.settings.prefix, capability).task(local)

    async def read(self, task_id: str, upto: int | None = None) -> Snapshot | None:
        """The task as of its event `upto` (now, when None); None when there is no such task."""
        key = self._key(task_id)
        record: Any = await self.gw.redis.hgetall(key) if key else None
        if not record:
            return None
        status = mapping.fold(events_of_record(record, task_id), upto)
        context_id = record.get("session_id") or task_id
        history = []
        if "payload" in record:
            a2a = _a2a_of(record.get("metadata"))
            history.append(mapping.user_message(task_id, context_id, codec.loads(record["payload"]), a2a))
        done = status.state == mapping.COMPLETED and record.get("result")
        result = codec.loads(record["result"]) if done else None
        extra = {"capability": record.get("cap"), "state": record.get("state"),
                 "attempt": int(record.get("attempt") or 0), "agent_id": record.get("agent_id") or None}
        return Snapshot(mapping.new_task(task_id, context_id, status, history, result, extra), status)

    async def result(self, task_id: str) -> Any:
        key = self._key(task_id)
        text: Any = await self.gw.redis.hget(key, "result") if key else None
        return codec.loads(text) if text else None


def _a2a_of(metadata: str | None) -> dict[str, Any]:
    try:
        value = codec.loads(metadata) if metadata else {}
    except ValueError:
        return {}
    a2a = value.get("a2a") if isinstance(value, dict) else None
    return a2a if isinstance(a2a, dict) else {}
