"""The five scenarios: which agent misbehaves, how, and when (as shares of the submit period).

Agents are named a1..a8. The misbehaving one is always a1 (a2 is the frozen one of "dying"); the
cold joiner is a8, started halfway through, so that scenario's fleet has 7 agents until then and
8 after. What an agent does is in its control file (see behaviour.py): failing every task, or
slow from a given moment, or cold for its first seconds of work. Kill, stop, continue and join
are the harness's own acts (runner.py), at the times the events say.

A task "touched the bad agent" when one of its executions ran on a bad agent and overlapped the
bad window: after the slow agent turned slow; anywhere on the black hole; still running on the
killed agent when it was killed, or on the frozen one while it was stopped; on the joiner within
its first cold seconds of work.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bench.fleet.workload import Workload

SLOW_FACTOR = 10.0
COLD_FACTOR = 5.0
INF = float("inf")


@dataclass(frozen=True)
class Timings:
    """Seconds for the scenarios' own clocks (the smoke run shortens them)."""

    stop_s: float = 20.0
    """How long the frozen agent stays SIGSTOPped."""
    cold_s: float = 5.0
    """How long the joiner stays slow after its first task."""


@dataclass(frozen=True)
class Event:
    share: float
    """When: this share of the submit period, plus `after_s` seconds."""
    action: str
    """slow | kill | stop | cont | join (what the harness does to `agent`)."""
    agent: str
    after_s: float = 0.0

    def at_s(self, workload: Workload) -> float:
        return workload.at(self.share) + self.after_s


@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    what: str
    events: tuple[Event, ...] = ()
    failing: tuple[str, ...] = ()
    """Agents that fail every task at once with a retryable error."""
    cold: tuple[str, ...] = ()
    """Agents 5x slower for their first `cold_s` of work."""
    late: tuple[str, ...] = ()
    """Agents started by a join event rather than with the fleet."""
    bad: tuple[str, ...] = field(default=())
    """Agents whose executions count as touching the bad agent (in their windows)."""

    def agents(self, workload: Workload) -> list[str]:
        return [f"a{k}" for k in range(1, workload.agents + 1)]

    def control(self, agent: str, timings: Timings) -> dict[str, Any]:
        """What the agent's control file says when it starts (slow comes later, with the event)."""
        return {"fail": agent in self.failing, "slow_from_ms": None, "slow_factor": SLOW_FACTOR,
                "cold_ms": timings.cold_s * 1000 if agent in self.cold else 0,
                "cold_factor": COLD_FACTOR}

    def windows(self, marks: dict[str, float], first_start: dict[str, float],
                timings: Timings) -> list[tuple[str, float, float]]:
        """(agent, from ms, to ms) for each bad window, from the times the events happened."""
        out: list[tuple[str, float, float]] = []
        for agent in self.bad:
            if agent in self.failing:
                out.append((agent, -INF, INF))
            elif agent in self.cold:
                start = first_start.get(agent)
                if start is not None:
                    out.append((agent, start, start + timings.cold_s * 1000))
            elif f"slow:{agent}" in marks:
                out.append((agent, marks[f"slow:{agent}"], INF))
            elif f"kill:{agent}" in marks:
                out.append((agent, marks[f"kill:{agent}"], INF))
            elif f"stop:{agent}" in marks:
                out.append((agent, marks[f"stop:{agent}"], marks.get(f"cont:{agent}", INF)))
        return out


def all_scenarios(timings: Timings) -> list[Scenario]:
    return [
        Scenario("healthy", "healthy", "8 healthy agents: the baseline"),
        Scenario("slow", "slow agent",
                 f"a1's calls take {SLOW_FACTOR:.0f} x longer from a third of the way in",
                 events=(Event(1 / 3, "slow", "a1"),), bad=("a1",)),
        Scenario("blackhole", "black hole", "a1 fails every task at once with a retryable error",
                 failing=("a1",), bad=("a1",)),
        Scenario("dying", "dying agents",
                 f"a1 SIGKILLed a third of the way in; a2 SIGSTOPped halfway for {timings.stop_s:g} s, "
                 "then SIGCONTed",
                 events=(Event(1 / 3, "kill", "a1"), Event(1 / 2, "stop", "a2"),
                         Event(1 / 2, "cont", "a2", after_s=timings.stop_s)),
                 bad=("a1", "a2")),
        Scenario("cold", "cold joiner",
                 f"7 agents; a8 joins halfway, {COLD_FACTOR:.0f} x slower for its first "
                 f"{timings.cold_s:g} s of work",
                 events=(Event(1 / 2, "join", "a8"),), cold=("a8",), late=("a8",), bad=("a8",)),
    ]


SCENARIO_KEYS = [s.key for s in all_scenarios(Timings())]
