"""Following what happens in the fleet: the capabilities' event feeds (`P:{cap}:events`, an entry
per script call holding its tasks' events, see lua/_events.lua) and the registry's events
(agents registering, changing state, leaving), for the console and `reach top`.

A FeedReader remembers where it stopped in each stream; each read returns what came since (a
stream it has not read before: its last few entries, so a new view starts with the recent past).
It reads each stream with its own XRANGE in one pipeline: the streams live in different Cluster
slots, which one XREAD cannot span.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from broker.infra.connection import SyncRedis
from broker.keys import CapabilityKeys, RegistryKeys
from broker.settings import Settings

BACKLOG = 20
"""Entries of a stream's recent past a reader starts with."""
READ_MAX = 500
"""Most entries read from one stream at once (a burst beyond waits for the next read)."""
REGISTRY = "_registry"


@dataclass(frozen=True, slots=True)
class FeedEvent:
    capability: str
    """The capability, or REGISTRY for an agent's event."""
    type: str
    time_ms: int
    task_id: str = ""
    attempt: int = 0
    agent_id: str = ""
    detail: str = ""
    """A task event's data (JSON text), an agent event's detail."""

    @property
    def is_agent_event(self) -> bool:
        return self.capability == REGISTRY


def parse_task_lines(capability: str, text: str) -> list[FeedEvent]:
    """A feed entry's `events` field: lines `task id|seq|type|time ms|attempt|agent id|data`."""
    out = []
    for line in text.splitlines():
        parts = line.split("|", 6)
        if len(parts) != 7 or not parts[3].isdigit():
            continue  # (a line written by someone else: skipped, never a crash)
        task_id, _, etype, time_ms, attempt, agent, data = parts
        out.append(FeedEvent(capability, etype, int(time_ms), task_id,
                             int(attempt) if attempt.isdigit() else 0, agent, data))
    return out


def parse_registry_entry(entry_id: str, fields: dict[str, str]) -> FeedEvent:
    time_ms = fields.get("time", "")
    return FeedEvent(REGISTRY, fields.get("type", "?"),
                     int(time_ms) if time_ms.isdigit() else int(entry_id.split("-")[0]),
                     agent_id=fields.get("agent_id", ""), detail=fields.get("detail", ""))


class FeedReader:
    def __init__(self, settings: Settings, backlog: int = BACKLOG) -> None:
        self.settings = settings
        self.backlog = backlog
        self.last: dict[str, str] = {}
        """Stream key -> the last entry id read."""

    def read(self, client: SyncRedis, capabilities: list[str]) -> list[FeedEvent]:
        """Every event since the last read, oldest first."""
        streams = [(c, CapabilityKeys(self.settings.prefix, c).events) for c in capabilities]
        streams.append((REGISTRY, RegistryKeys(self.settings.prefix).events))
        pipe = client.pipeline(transaction=False)
        for _, key in streams:
            last = self.last.get(key)
            if last is None:
                pipe.xrevrange(key, "+", "-", count=self.backlog)
            else:
                pipe.xrange(key, f"({last}", "+", count=READ_MAX)
        events: list[FeedEvent] = []
        for (capability, key), reply in zip(streams, pipe.execute(), strict=True):
            entries: list[Any] = reply if key in self.last else list(reversed(reply))
            if key not in self.last:
                self.last[key] = entries[-1][0] if entries else "0-0"
            for entry_id, fields in entries:
                self.last[key] = entry_id
                if capability == REGISTRY:
                    events.append(parse_registry_entry(entry_id, fields or {}))
                else:
                    events += parse_task_lines(capability, (fields or {}).get("events", ""))
        events.sort(key=lambda e: e.time_ms)
        return events
