"""The wake-ups dispatchers listen to, on the `<prefix>:wake` channel (built by lua/_wake.lua).

    task <cap>                          new or due tasks were queued
    free <cap> <agent> <len> <pending> <failures> <n> <exec ms> <pulled> [<speed ms> <samples>]
                                        an agent finished n tasks in exec ms in all (its exact
                                        inbox load after, its consecutive failures) and took
                                        `pulled` ready tasks in their place (a standing pull);
                                        with its speed after them when some succeeded (see
                                        protocol/health.py): sent also for a completion that
                                        is otherwise quiet when that speed is news
    took <cap> <agent> <len> <pending> <n> <left>
                                        a submit handed n tasks straight to the agent (grants),
                                        leaving `left` grants: sent when that falls to a power
                                        of two below half of those written, or to none
    agent <agent>                       the registry changed
    policy <cap>                        a capability's policy changed ('*': the fleet's)

Pub/sub only shortens waits (a dispatcher's idle tick makes progress if a message is lost), so
a message that does not parse is dropped. Older producers' forms are still read: `free` with 5
to 9 fields (no load speed, no pull, no speed), `took` without `left` (one per hand-off).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from broker.keys import Channels
from broker.protocol.health import parse_speed
from broker.settings import Settings


@dataclass(frozen=True, slots=True)
class TasksQueued:
    capability: str

    def encode(self) -> str:
        return f"task {self.capability}"


@dataclass(frozen=True, slots=True)
class AgentFreed:
    capability: str
    agent_id: str
    inbox_len: int
    inbox_pending: int
    failures: int | None = None
    """Consecutive failures its completion left (None: not told)."""
    finished: int = 1
    exec_ms: float | None = None
    """Execution time of the `finished` tasks in all (None: not told)."""
    pulled: int = 0
    speed: tuple[float, int] | None = None
    """The agent's speed after these tasks, (ms, samples) (None: not told)."""

    def encode(self) -> str:
        tail = "" if self.speed is None else f" {self.speed[0]:.1f} {self.speed[1]}"
        return (f"free {self.capability} {self.agent_id} {self.inbox_len} {self.inbox_pending} "
                f"{self.failures or 0} {self.finished} {round(self.exec_ms or 0)} {self.pulled}{tail}")


@dataclass(frozen=True, slots=True)
class GrantsTaken:
    capability: str
    agent_id: str
    inbox_len: int
    inbox_pending: int
    taken: int
    left: int | None = None
    """Grants standing after the hand-off (None: a producer that tells every hand-off)."""

    def encode(self) -> str:
        tail = "" if self.left is None else f" {self.left}"
        return (f"took {self.capability} {self.agent_id} {self.inbox_len} {self.inbox_pending} "
                f"{self.taken}{tail}")


@dataclass(frozen=True, slots=True)
class RegistryChanged:
    agent_id: str

    def encode(self) -> str:
        return f"agent {self.agent_id}"


@dataclass(frozen=True, slots=True)
class PolicyChanged:
    capability: str
    """'*' for the fleet's defaults."""

    def encode(self) -> str:
        return f"policy {self.capability}"


WakeMessage = TasksQueued | AgentFreed | GrantsTaken | RegistryChanged | PolicyChanged


def parse(text: str) -> WakeMessage | None:
    """The message, or None when it is not one (a stranger's, or malformed)."""
    parts = text.split(" ")
    kind = parts[0]
    try:
        if kind == "task" and len(parts) == 2:
            return TasksQueued(parts[1])
        if kind == "agent" and len(parts) == 2:
            return RegistryChanged(parts[1])
        if kind == "policy" and len(parts) == 2:
            return PolicyChanged(parts[1])
        if kind == "free" and (5 <= len(parts) <= 9 or len(parts) == 11):
            return _freed(parts)
        if kind == "took" and len(parts) in (6, 7):
            return GrantsTaken(parts[1], parts[2], int(parts[3]), int(parts[4]), int(parts[5]),
                               int(parts[6]) if len(parts) == 7 else None)
    except ValueError:
        return None
    return None


def _freed(parts: list[str]) -> AgentFreed | None:
    failures = int(parts[5]) if len(parts) >= 6 else None
    finished, exec_ms = 1, None
    if len(parts) >= 8:
        finished, exec_ms = int(parts[6]), float(parts[7])
        if finished <= 0 or not math.isfinite(exec_ms) or exec_ms < 0:
            finished, exec_ms = 1, None  # (a malformed speed is no news; the load still is)
    speed = parse_speed(f"{parts[9]} {parts[10]}") if len(parts) == 11 else None
    return AgentFreed(parts[1], parts[2], int(parts[3]), int(parts[4]), failures, finished,
                      exec_ms, int(parts[8]) if len(parts) >= 9 else 0, speed)


def channel_name(settings: Settings) -> str:
    return Channels(settings.prefix).wake
