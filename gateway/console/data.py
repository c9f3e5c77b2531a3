"""What the console's pages show, read from Redis (synchronous reads, run in threads).

    fleet_snapshot   every capability's queues and every agent, as the Overview and Agents
                     pages (and `reach top`) show them: one read for all open tabs (live.py)
    activity         submitted and dead-lettered tasks per minute over the last hour, per
                     capability (the Overview's sparklines)
    task_detail      one task: its row, payload, result and whole event timeline
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from broker import codec
from broker.errors import UnknownTask
from broker.ids import split_task_id
from broker.infra.connection import SyncRedis
from broker.keys import CapabilityKeys, RegistryKeys
from broker.models import TaskEvent, TaskStatus
from broker.ops.overview import AgentRow, QueueRow, agent_rows, queue_rows
from broker.protocol.health import parse_health
from broker.protocol.search import dlq_page_call, parse_dlq_page
from broker.registry import clock_of
from broker.scripts import Scripts
from broker.settings import Settings

MINUTES = 60
FAILURES_READ = 2000
"""Most dead letters the failure sparkline counts per capability (beyond: the line tops out)."""


@dataclass(slots=True)
class AgentView:
    row: AgentRow
    held_slots: int = 0
    circuits: dict[str, str] = field(default_factory=dict)
    """Capability -> 'open' or 'probe' (a probe task may pass); closed circuits are left out."""


@dataclass(slots=True)
class FleetSnapshot:
    now_ms: int
    queues: list[QueueRow]
    agents: list[AgentView]

    def counts(self) -> dict[str, int]:
        """Agents by state."""
        out: dict[str, int] = {}
        for a in self.agents:
            out[a.row.state] = out.get(a.row.state, 0) + 1
        return out


def fleet_snapshot(client: SyncRedis, settings: Settings) -> FleetSnapshot:
    now = clock_of(client, RegistryKeys(settings.prefix).agents)
    queues = queue_rows(client, settings)
    rows = agent_rows(client, settings)
    keys = RegistryKeys(settings.prefix)
    pipe = client.pipeline(transaction=False)
    for row in rows:
        pipe.hget(keys.agent(row.agent_id), "stats")
    stats = pipe.execute() if rows else []
    capabilities = sorted({c for row in rows for c in row.capabilities})
    for name in capabilities:
        pipe.hgetall(CapabilityKeys(settings.prefix, name).health)
    health = dict(zip(capabilities, pipe.execute() if capabilities else [], strict=True))
    views = []
    for row, text in zip(rows, stats, strict=True):
        view = AgentView(row, held_slots=_held(text))
        for name in row.capabilities:
            h = parse_health(health.get(name) or {}).get(row.agent_id)
            if h is not None and h.consecutive_failures >= settings.circuit_failures:
                opened = now - h.last_failure_ms < settings.circuit_open_ms
                view.circuits[name] = "open" if opened else "probe"
        views.append(view)
    return FleetSnapshot(now, queues, views)


def _held(stats_text: Any) -> int:
    try:
        value = json.loads(stats_text).get("held_slots", 0) if stats_text else 0
        return int(value) if isinstance(value, int | float) else 0
    except (ValueError, AttributeError, RecursionError):
        return 0


@dataclass(slots=True)
class Activity:
    submitted: list[int]
    failed: list[int]
    """Per minute, oldest first, the last MINUTES minutes."""
    failed_capped: bool = False


def activity(client: SyncRedis, scripts: Scripts, settings: Settings, capabilities: list[str],
             now_ms: int) -> dict[str, Activity]:
    """Per capability: tasks submitted per minute (counted in the task index) and dead letters
    per minute (the newest FAILURES_READ of the last hour)."""
    start = now_ms - MINUTES * 60_000
    out = {}
    for name in capabilities:
        keys = CapabilityKeys(settings.prefix, name)
        pipe = client.pipeline(transaction=False)
        for i in range(MINUTES):
            low = start + i * 60_000
            pipe.zcount(keys.tasks, low, f"({low + 60_000}")
        submitted = [int(n) for n in pipe.execute()]
        failed = [0] * MINUTES
        letters = parse_dlq_page(scripts(dlq_page_call(settings, name, "+", str(start), FAILURES_READ)))
        for entry_id, _ in letters:
            minute = (int(entry_id.split("-")[0]) - start) // 60_000
            if 0 <= minute < MINUTES:
                failed[minute] += 1
        out[name] = Activity(submitted, failed, len(letters) >= FAILURES_READ)
    return out


@dataclass(slots=True)
class TaskDetail:
    status: TaskStatus
    payload: Any
    result: Any
    has_result: bool
    events: list[TaskEvent]
    record: dict[str, str]
    """The record's other fields worth showing (routing, metadata, timeouts ...)."""


_SHOWN_FIELDS = ("session_id", "region", "routing", "metadata", "timeout_ms", "max_attempts",
                 "idempotency_key", "replays", "last_agent_id", "exec_ms")


def task_detail(client: SyncRedis, settings: Settings, task_id: str) -> TaskDetail:
    capability, local = split_task_id(task_id)
    record: Any = client.hgetall(CapabilityKeys(settings.prefix, capability).task(local))
    if not record or "state" not in record:
        raise UnknownTask(task_id)
    status = TaskStatus.from_record(record)
    events = []
    # (the events the record holds: seqs have gaps where progress events were dropped)
    seqs = sorted(int(name[2:]) for name in record if name.startswith("e:") and name[2:].isdigit())
    for seq in seqs:
        text = record[f"e:{seq}"]
        try:
            events.append(TaskEvent.from_compact(seq, text, task_id, status.trace_id))
        except ValueError:
            continue
    has_result = "result" in record
    return TaskDetail(status, _json(record.get("payload")), _json(record.get("result")), has_result,
                      events, {k: record[k] for k in _SHOWN_FIELDS if record.get(k)})


def _json(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return codec.loads(text)
    except ValueError:
        return text
