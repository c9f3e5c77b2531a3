"""What routing reasons about: agents as candidates with their inbox load, ready tasks with
their constraints, and the choice made for a task."""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.protocol.health import AgentHealth


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
    latency_baseline_ms: float | None = None
    stability: float | None = None
    region: str | None = None
    version: str | None = None
    recovered_at_ms: int = 0
    health: AgentHealth = field(default_factory=AgentHealth)
    recent_exec_ms: float | None = None
    """Mean execution time of its latest completions, from the dispatcher's wake-up messages."""


@dataclass(frozen=True, slots=True)
class ReadyTask:
    local_id: str
    priority: int = 5
    session_id: str = ""
    region: str = ""
    region_strict: bool = True
    version: str = ""
    last_agent_id: str = ""
    """The agent whose attempt failed last: a retry goes elsewhere when another agent can take it."""
    session_agent: str = ""
    """The agent that served the task's session last."""
    ready_at_ms: int = 0
    """When it became ready, by the server's clock (0: not known, as if long ago)."""


@dataclass(frozen=True, slots=True)
class Choice:
    agent_id: str
    why: str
    score: float
    eligible: int
