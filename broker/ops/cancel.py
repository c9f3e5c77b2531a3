"""Canceling many tasks at once: `reach cancel --capability C [--state ...] [--older-than ...]`
and `client.cancel_many(...)`. The tasks are found where they wait (the ready queue, the
delayed set, the agents' inboxes), filtered by state and age from their records, and each is
canceled by cancel.lua as `client.cancel` does, so one that ends meanwhile is left as it ended."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from broker.errors import BadInput
from broker.ids import check_capability, split_task_id
from broker.infra.connection import SyncRedis
from broker.keys import CapabilityKeys
from broker.protocol.calls import Status
from broker.protocol.lifecycle import CancelReply, cancel_call, parse_cancel
from broker.scripts import Scripts
from broker.settings import Settings

STATES = {"queued": ("queued",), "scheduled": ("scheduled",), "retrying": ("retrying",),
          "running": ("dispatched", "running")}
"""What each --state names (running: handed to an agent, read or not)."""
BATCH = 1000


@dataclass
class CancelReport:
    matched: int = 0
    canceled: int = 0
    ended: int = 0
    """Matched, but ended before their cancel (left as they ended)."""
    task_ids: list[str] = field(default_factory=list)
    """The tasks matched (with dry_run: those a cancel would touch)."""

    def as_dict(self) -> dict[str, Any]:
        return {"matched": self.matched, "canceled": self.canceled, "ended": self.ended}


def _candidates(client: SyncRedis, ck: CapabilityKeys, states: set[str]) -> list[str]:
    """Local ids of tasks that may be in one of `states` (their records decide)."""
    out: list[str] = []
    if "queued" in states:
        queued: Any = client.zrange(ck.queue, 0, -1)
        out += queued
    if states & {"scheduled", "retrying"}:
        delayed: Any = client.zrange(ck.delayed, 0, -1)
        out += delayed
    if states & {"dispatched", "running"}:
        agents: Any = client.smembers(ck.inboxes)
        for agent in sorted(agents):
            entries: Any = client.xrange(ck.inbox(agent))
            out += [fields["id"] for _, fields in entries if fields and fields.get("id")]
    return list(dict.fromkeys(out))


def select(client: SyncRedis, settings: Settings, capability: str, states: Iterable[str] = (),
           older_than_ms: int | None = None, now_ms: int = 0) -> list[str]:
    """Task ids of the capability in the given states (all unfinished ones when none are
    given), created before now_ms - older_than_ms when that is given."""
    check_capability(capability)
    unknown = sorted(set(states) - set(STATES))
    if unknown:
        raise BadInput(f"unknown --state {', '.join(unknown)}: use {', '.join(STATES)}")
    wanted = {s for name in (states or STATES) for s in STATES[name]}
    ck = CapabilityKeys(settings.prefix, capability)
    locals_ = _candidates(client, ck, wanted)
    chosen = []
    for start in range(0, len(locals_), BATCH):
        chunk = locals_[start:start + BATCH]
        pipe = client.pipeline(transaction=False)
        for local in chunk:
            pipe.hmget(ck.task(local), "state", "created_at")
        rows: Any = pipe.execute()
        for local, (state, created) in zip(chunk, rows, strict=True):
            if state not in wanted:
                continue
            if older_than_ms is not None and int(created or 0) > now_ms - older_than_ms:
                continue
            chosen.append(f"{capability}:{local}")
    return chosen


CANCEL_FOLLOWS = 10
"""How often a cancel follows a task that moved to another agent meanwhile."""


def cancel_one(client: SyncRedis, scripts: Scripts, settings: Settings, task_id: str) -> CancelReply:
    """Cancel a task wherever it is (its status: canceled, terminal or gone)."""
    capability, local = split_task_id(task_id)
    agent: Any = client.hget(CapabilityKeys(settings.prefix, capability).task(local), "agent_id") or ""
    for _ in range(CANCEL_FOLLOWS):
        reply = parse_cancel(scripts(cancel_call(settings, task_id, agent)))
        if reply.status is not Status.MOVED:
            break
        agent = reply.detail  # it moved to another agent meanwhile: follow it
    return reply


def cancel_all(client: SyncRedis, scripts: Scripts, settings: Settings, task_ids: list[str],
               progress: Callable[[int], None] | None = None) -> CancelReport:
    """Cancel each task."""
    report = CancelReport(matched=len(task_ids), task_ids=task_ids)
    for task_id in task_ids:
        reply = cancel_one(client, scripts, settings, task_id)
        if reply.status is Status.CANCELED:
            report.canceled += 1
        else:
            report.ended += 1
        if progress is not None:
            progress(1)
    return report
