"""Choosing an agent for each ready task (pure functions; the dispatcher feeds them).

An agent's inbox load is exact: `outstanding` entries were dispatched and not finished, of which
`running` the agent has taken (its consumer-group pending count) and the rest are unread.

How many more tasks an agent may receive now (its room):
- none while its running/max_concurrency is at or above the watermark (0.85): a nearly full
  agent keeps its headroom and new work goes elsewhere;
- never more unread entries than backlog_factor x max_concurrency (the hard limit that the
  dispatch script also enforces atomically);
- within that, free slots plus a prefetch sized to the agent's speed: about as many tasks as it
  finishes while the dispatcher refills (Little's law), at least 1. Fast agents get a deep
  buffer (throughput); slow ones little more than their free slots, so queued work stays in the
  priority queue where any agent can take it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from broker.settings import Settings

REFILL_WINDOW_MS = 20.0
"""How long the dispatcher may take to refill an inbox; prefetch covers this much work."""


@dataclass(slots=True)
class InboxLoad:
    outstanding: int = 0
    running: int = 0

    @property
    def unread(self) -> int:
        return max(0, self.outstanding - self.running)


@dataclass(slots=True)
class Candidate:
    agent_id: str
    max_concurrency: int
    load: InboxLoad
    latency_p50_ms: float | None = None


@dataclass(frozen=True, slots=True)
class ReadyTask:
    local_id: str
    priority: int = 5
    session_id: str = ""
    region: str = ""
    last_agent_id: str = ""
    """The agent whose attempt failed last: a retry goes elsewhere when another agent has room."""


def max_unread(candidate: Candidate, settings: Settings) -> int:
    return settings.backlog_factor * candidate.max_concurrency


def prefetch(candidate: Candidate, settings: Settings) -> int:
    cap = max_unread(candidate, settings)
    p50 = candidate.latency_p50_ms
    if p50 is None:
        return 1
    return max(1, min(cap, math.ceil(candidate.max_concurrency * REFILL_WINDOW_MS / max(p50, 0.01))))


def room(candidate: Candidate, settings: Settings) -> int:
    """How many more tasks this agent may be given now (0: skip it)."""
    conc = candidate.max_concurrency
    load = candidate.load
    if load.running / conc >= settings.watermark:
        return 0
    by_backlog = max_unread(candidate, settings) - load.unread
    by_speed = conc - load.running + prefetch(candidate, settings) - load.unread
    return max(0, min(by_backlog, by_speed))


def assign(tasks: Sequence[ReadyTask], candidates: Sequence[Candidate], settings: Settings,
           rng: random.Random | None = None) -> dict[str, list[str]]:
    """Agent id -> local ids, in task order. Each task goes to the least-loaded agent with room
    (ties broken at random); tasks nobody has room for are left out and stay queued."""
    rng = rng or random.Random()
    rooms = {c.agent_id: room(c, settings) for c in candidates}
    outstanding = {c.agent_id: c.load.outstanding for c in candidates}
    conc = {c.agent_id: c.max_concurrency for c in candidates}
    plan: dict[str, list[str]] = {}
    for task in tasks:
        open_agents = [a for a, r in rooms.items() if r > 0]
        if not open_agents:
            break
        if task.last_agent_id and len(open_agents) > 1:
            open_agents = [a for a in open_agents if a != task.last_agent_id] or open_agents
        best = min(outstanding[a] / conc[a] for a in open_agents)
        choices = [a for a in open_agents if outstanding[a] / conc[a] == best]
        agent = rng.choice(choices)
        plan.setdefault(agent, []).append(task.local_id)
        rooms[agent] -= 1
        outstanding[agent] += 1
    return plan
