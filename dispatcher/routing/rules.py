"""The rules routing applies to one agent: filters, room, score (pure functions).

Filter (agent level, once per routing round): healthy only; circuit not open (circuit_failures
consecutive failures open it for circuit_open_ms, then one probe task is let through: success
closes it, failure opens it again); not ejected (slow_tasks_to_eject consecutive tasks over the
latency ceiling, for eject_ms, then a probe); running/max_concurrency below the watermark; room
in the inbox (see `room`; above the watermark an agent that finishes tasks within the refill
window still gets that much, see `at_watermark`). Task level: region (strict; or preferred: an
agent of the region while one is alive, busy or not, else any), version constraint, cold start
(an agent that recovered less than cold_start_ms ago gets only tasks of priority <=
cold_start_max_priority, unless no warm agent can take the task).

Speed: how long an agent takes per task, judged from the speed its completions keep in the
health hash (a moving geometric mean of its latest successes, see broker/protocol/health.py:
it turns within a handful of tasks, and the completion that moves it far enough tells the
dispatchers at once) once it counted SPEED_KNOWN tasks, else from the heartbeat's p50 of the
last 100 (which turns after some fifty tasks and arrives with the next heartbeat).

Slower than the fleet: an agent whose told speed is above slow_factor x the fleet's (the lower
median of the told speeds of the capability's healthy agents, at least two of them; floored at
SPEED_FLOOR_MS) is the overflow: it takes a task only where no faster agent has room, and only
one that has waited in the queue twice as long as the agent is slower than the fleet per task
(round.py's OVERFLOW_WAIT; at once when no faster agent could take it later), never more than
its free slots (no prefetch, no grant, no pull); and, once it holds nothing and its last
success is RECHECK_MS old (or its own time per task, if longer), one task to measure it again,
as any agent would get it. A task
sent to it takes slow_factor x longer than anywhere else, while in the queue the next free slot
of a faster agent takes it; only a backlog that makes the wait longer than the slowness is
worth the slow agent's help.

Score, in points: 100 x (0.35 free capacity + 0.30 affinity + 0.20 latency + 0.15 stability),
minus 30 while the agent runs slower than 3 x its own baseline or than the fleet; never below 1
so that every eligible agent keeps a chance. Weights and thresholds come from the settings.

Choice: weighted random by score (not argmax, which makes hot spots). A task with a session goes
to the session's agent while it passes the filters; otherwise it is rebalanced and the session
moves (the dispatch script records the new agent). A retry avoids the agent that failed it when
another one can take it.

An agent's room: how many more tasks it may be given now. While running/max_concurrency is at
or above the watermark, only its refill allowance (what it finishes while its inbox is refilled,
REFILL_WINDOW_MS: nothing for an agent that finishes less than a task in that time, or of
unknown speed), topped up once half of it is used; never more unread entries than
backlog_factor x max_concurrency (the dispatch script enforces this atomically too); within
that, free slots plus a prefetch sized to the agent's speed (Little's law, see `prefetch`):
fast agents get a deep buffer; an agent that finishes less than one task per refill gets its
free slots only, so queued work stays in the priority queue where the fleet's next free slot
takes it, not in one busy agent's inbox behind its running tasks.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from broker.protocol.health import SPEED_FLOOR_MS, SPEED_KNOWN, AgentHealth
from broker.settings import Settings
from dispatcher.routing.model import Candidate

REFILL_WINDOW_MS = 2.0
"""How long refilling an inbox takes, which prefetch covers: an agent's report of finished tasks
takes the next ones itself (a pull while tasks wait, broker/lua/_pull.lua; while none wait, the
grants it gives back take the next submits, _credits.lua) and reads them in the same round trip
(agent_worker/reporter.py): about a millisecond, twice that on a loaded host. (A dispatcher
round, the refill of a task with routing constraints or after a failure, takes longer; it
follows the completion at once.)"""
RECHECK_MS = 1000
"""An agent slower than the fleet that holds nothing gets one task this long after its last
success, to see whether it still is (four or five such tasks bring a recovered agent back)."""


def max_unread(candidate: Candidate, settings: Settings) -> int:
    return settings.backlog_factor * candidate.max_concurrency


def task_ms(candidate: Candidate) -> float | None:
    """How long the agent takes per task now: its most recent completions when the dispatcher
    saw some (fresher than the heartbeat's p50), else the heartbeat's p50."""
    if candidate.recent_exec_ms is not None:
        return candidate.recent_exec_ms
    return candidate.latency_p50_ms


def told_speed(candidate: Candidate) -> float | None:
    """The agent's speed as its completions keep it, once they counted enough tasks."""
    return judged_speed(candidate.health, None)


def judged_speed(health: AgentHealth | None, latency_p50_ms: float | None) -> float | None:
    """How long an agent takes per task, for judging it: its told speed (its health), else the
    heartbeat's p50 (see the module's docstring)."""
    if health is not None and health.speed_samples >= SPEED_KNOWN and health.speed_ms > 0:
        return health.speed_ms
    return latency_p50_ms


def speed(candidate: Candidate) -> float | None:
    return judged_speed(candidate.health, candidate.latency_p50_ms)


def fleet_speed(candidates: Iterable[Candidate]) -> float | None:
    """The lower median of the agents' told speeds (None with fewer than two): an agent is
    slower than the fleet against this (the lower one, so that of two agents the slow one is)."""
    known = sorted(ms for c in candidates if (ms := told_speed(c)) is not None)
    if len(known) < 2:
        return None
    return max(known[(len(known) - 1) // 2], SPEED_FLOOR_MS)


def slower_than_fleet(candidate: Candidate, settings: Settings, fleet_ms: float | None) -> bool:
    ms = told_speed(candidate)
    return fleet_ms is not None and ms is not None and ms > settings.slow_factor * fleet_ms


def refill_allowance(candidate: Candidate, settings: Settings) -> int:
    """Unread tasks the agent finishes while the dispatcher refills its inbox (Little's law:
    concurrency x refill window / time per task); 0 for an agent of unknown speed."""
    ms = task_ms(candidate)
    if ms is None:
        return 0
    return min(max_unread(candidate, settings),
               math.floor(candidate.max_concurrency * REFILL_WINDOW_MS / max(ms, 0.01)))


def prefetch(candidate: Candidate, settings: Settings) -> int:
    """Unread tasks beyond the agent's free slots: its refill allowance (none for an agent
    that finishes less than a task per refill: a task in its inbox would wait for its next free
    slot, while in the queue the fleet's next free slot takes it); one for an agent of unknown
    speed (a new agent, before its first reports)."""
    if task_ms(candidate) is None:
        return 1
    return refill_allowance(candidate, settings)


def at_watermark(candidate: Candidate, settings: Settings) -> bool:
    """Running at or above the watermark, and holding at least what it finishes during a refill.

    The watermark keeps work away from a busy agent so that it waits in the priority queue,
    where any agent can take it. An agent that finishes tasks in a fraction of the refill window
    is not kept waiting for that: it still gets its refill allowance (for a slow agent that is
    zero, so a task never sits behind a long one), which keeps fast agents from idling between
    two dispatcher rounds."""
    load = candidate.load
    return (load.running / candidate.max_concurrency >= settings.watermark
            and load.unread >= refill_allowance(candidate, settings))


def room(candidate: Candidate, settings: Settings) -> int:
    """How many more tasks this agent may be given now (0: skip it)."""
    conc = candidate.max_concurrency
    load = candidate.load
    by_backlog = max_unread(candidate, settings) - load.unread
    if load.running / conc >= settings.watermark:
        allowance = refill_allowance(candidate, settings)
        # Top the buffer up once half of it is used, not after every completion: a fast agent
        # gets a few big batches instead of a stream of one-task rounds.
        if load.unread > allowance // 2:
            return 0
        return max(0, min(by_backlog, allowance - load.unread))
    by_speed = conc - load.running + prefetch(candidate, settings) - load.unread
    return max(0, min(by_backlog, by_speed))


def gate(candidate: Candidate, settings: Settings, now_ms: int,
         probes: dict[str, int]) -> tuple[str | None, bool]:
    """(reason the agent is filtered out or None, whether it is only allowed one probe task)."""
    h = candidate.health
    probe_out = probes.get(candidate.agent_id, 0)
    for tripped, since, hold in (
        (h.consecutive_failures >= settings.circuit_failures, h.last_failure_ms, settings.circuit_open_ms),
        (settings.latency_ceiling_ms > 0 and h.consecutive_slow >= settings.slow_tasks_to_eject,
         h.last_slow_ms, settings.eject_ms),
    ):
        if not tripped:
            continue
        kind = "circuit_open" if hold == settings.circuit_open_ms else "ejected_slow"
        if now_ms - since < hold:
            return kind, False
        if probe_out >= since and now_ms - probe_out < settings.lease_ms + hold:
            return f"{kind}:probe_out", False
        return None, True
    if at_watermark(candidate, settings):
        return "watermark", False
    if candidate.load.unread >= max_unread(candidate, settings):
        return "backlog_full", False
    return None, False


def components(candidate: Candidate, settings: Settings, now_ms: int,
               best_ms: float | None, slower_than_fleet: bool = False) -> dict[str, float]:
    """The score's parts, each 0..1, and the slowness penalty in points. `best_ms`: the
    fastest agent's speed; `slower_than_fleet`: see the module's docstring."""
    c = candidate
    free = min(max(1.0 - c.load.outstanding / c.max_concurrency, 0.0), 1.0)
    affinity = 0.0
    if c.health.last_success_ms:
        affinity = max(0.0, 1.0 - (now_ms - c.health.last_success_ms) / settings.affinity_window_ms)
    latency = 0.5
    ms = speed(c)
    if ms is not None and best_ms is not None:
        latency = min(1.0, max(best_ms, 0.01) / max(ms, 0.01))
    stability = 1.0 if c.stability is None else min(max(c.stability, 0.0), 1.0)
    slow = slower_than_fleet or (ms is not None and c.latency_baseline_ms is not None
                                 and ms > settings.slow_factor * max(c.latency_baseline_ms, SPEED_FLOOR_MS))
    return {"free": free, "affinity": affinity, "latency": latency, "stability": stability,
            "penalty": settings.slow_penalty if slow else 0.0}


def score(parts: dict[str, float], settings: Settings) -> float:
    points = 100.0 * (settings.weight_capacity * parts["free"] + settings.weight_affinity * parts["affinity"]
                      + settings.weight_latency * parts["latency"]
                      + settings.weight_stability * parts["stability"]) - parts["penalty"]
    return max(1.0, points)
