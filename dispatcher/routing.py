"""Choosing an agent for each ready task: filter, score, weighted random choice (pure logic).

Filter (agent level, once per routing round): healthy only; circuit not open (circuit_failures
consecutive failures open it for circuit_open_ms, then one probe task is let through: success
closes it, failure opens it again); not ejected (slow_tasks_to_eject consecutive tasks over the
latency ceiling, for eject_ms, then a probe); running/max_concurrency below the watermark; room
in the inbox (see `room`; above the watermark an agent that finishes tasks within the refill
window still gets that much, see `at_watermark`). Task level: region (strict; or preferred: an
agent of the region while one is alive, busy or not, else any), version constraint, cold start
(an agent that recovered less than cold_start_ms ago gets only tasks of priority <=
cold_start_max_priority, unless no warm agent can take the task).

Score, in points: 100 x (0.35 free capacity + 0.30 affinity + 0.20 latency + 0.15 stability),
minus 30 while the agent runs slower than 3 x its own baseline; never below 1 so that every
eligible agent keeps a chance. Weights and thresholds come from the settings.

Choice: weighted random by score (not argmax, which makes hot spots). A task with a session goes
to the session's agent while it passes the filters; otherwise it is rebalanced and the session
moves (the dispatch script records the new agent). A retry avoids the agent that failed it when
another one can take it.

An agent's room: how many more tasks it may be given now. While running/max_concurrency is at
or above the watermark, only its refill allowance (what it finishes while the dispatcher refills
its inbox: nothing for a slow agent or one of unknown speed), topped up once half of it is used;
never more unread entries than backlog_factor x max_concurrency (the dispatch script enforces
this atomically too); within that, free slots plus a prefetch
sized to the agent's speed (about what it finishes while the dispatcher refills, Little's law):
fast agents get a deep buffer, slow ones little more than their free slots, so queued work stays
in the priority queue where any agent can take it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from broker.settings import Settings
from broker.versions import satisfies

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
class AgentHealth:
    """Per capability and agent, kept by complete.lua / reclaim.lua in the health hash."""

    consecutive_failures: int = 0
    last_failure_ms: int = 0
    last_success_ms: int = 0
    consecutive_slow: int = 0
    last_slow_ms: int = 0


def parse_health(fields: dict[str, str]) -> dict[str, AgentHealth]:
    """Agent id -> health, from the health hash (fields `cf:<agent>`, `lf:`, `ok:`, `cs:`, `ls:`)."""
    out: dict[str, AgentHealth] = {}
    names = {"cf": "consecutive_failures", "lf": "last_failure_ms", "ok": "last_success_ms",
             "cs": "consecutive_slow", "ls": "last_slow_ms"}
    for name, value in fields.items():
        kind, _, agent = name.partition(":")
        if kind in names and agent:
            try:
                setattr(out.setdefault(agent, AgentHealth()), names[kind], int(value))
            except ValueError:
                continue
    return out


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


@dataclass(frozen=True, slots=True)
class Choice:
    agent_id: str
    why: str
    score: float
    eligible: int


def decode_queue_score(score: float) -> tuple[int, bool]:
    """(priority, has routing constraints) of a ready task, from the fraction of its queue
    score (see queue_score in broker/lua/_lib.lua: (priority + 1) / 16, plus 1/32 when the task
    has a session, a region, a version or an agent to avoid)."""
    steps = round((score - math.floor(score)) * 32)
    return max(0, min(9, steps // 2 - 1)), bool(steps % 2)


def explanation(round_id: str, choice: Choice) -> str:
    """What a task's record keeps of its routing decision (field `explain`, for reach explain):
    `round|why|score|eligible agents`, short enough for Redis to keep the record compact."""
    return f"{round_id}|{choice.why}|{choice.score:g}|{choice.eligible}"


def parse_explanation(text: str | None) -> dict[str, Any] | None:
    """The decision an `explain` field records: round, why, score, eligible (None if none)."""
    if not text:
        return None
    parts = text.split("|")
    if len(parts) != 4:
        return None
    round_id, why, score, eligible = parts
    try:
        return {"round": round_id or None, "why": why, "score": float(score) if score else None,
                "eligible": int(eligible) if eligible else None}
    except ValueError:
        return None


def max_unread(candidate: Candidate, settings: Settings) -> int:
    return settings.backlog_factor * candidate.max_concurrency


def task_ms(candidate: Candidate) -> float | None:
    """How long the agent takes per task now: its most recent completions when the dispatcher
    saw some (fresher than the heartbeat's p50), else the heartbeat's p50."""
    if candidate.recent_exec_ms is not None:
        return candidate.recent_exec_ms
    return candidate.latency_p50_ms


def refill_allowance(candidate: Candidate, settings: Settings) -> int:
    """Unread tasks the agent finishes while the dispatcher refills its inbox (Little's law:
    concurrency x refill window / time per task); 0 for an agent of unknown speed."""
    ms = task_ms(candidate)
    if ms is None:
        return 0
    return min(max_unread(candidate, settings),
               math.floor(candidate.max_concurrency * REFILL_WINDOW_MS / max(ms, 0.01)))


def prefetch(candidate: Candidate, settings: Settings) -> int:
    return max(1, refill_allowance(candidate, settings))


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
               best_p50: float | None) -> dict[str, float]:
    """The score's parts, each 0..1, and the slowness penalty in points."""
    c = candidate
    free = min(max(1.0 - c.load.outstanding / c.max_concurrency, 0.0), 1.0)
    affinity = 0.0
    if c.health.last_success_ms:
        affinity = max(0.0, 1.0 - (now_ms - c.health.last_success_ms) / settings.affinity_window_ms)
    latency = 0.5
    if c.latency_p50_ms is not None and best_p50 is not None:
        latency = min(1.0, max(best_p50, 0.01) / max(c.latency_p50_ms, 0.01))
    stability = 1.0 if c.stability is None else min(max(c.stability, 0.0), 1.0)
    slow = (c.latency_p50_ms is not None and c.latency_baseline_ms is not None
            and c.latency_p50_ms > settings.slow_factor * max(c.latency_baseline_ms, 0.01))
    return {"free": free, "affinity": affinity, "latency": latency, "stability": stability,
            "penalty": settings.slow_penalty if slow else 0.0}


def score(parts: dict[str, float], settings: Settings) -> float:
    points = 100.0 * (settings.weight_capacity * parts["free"] + settings.weight_affinity * parts["affinity"]
                      + settings.weight_latency * parts["latency"]
                      + settings.weight_stability * parts["stability"]) - parts["penalty"]
    return max(1.0, points)


class WeightedPool:
    """Weighted random sampling with O(log n) updates (a Fenwick tree of weights)."""

    def __init__(self, weights: Sequence[float]) -> None:
        self.n = len(weights)
        self.weights = [0.0] * self.n
        self.tree = [0.0] * (self.n + 1)
        self.positive = 0
        """How many weights are above zero (the agents a choice was made among)."""
        for i, w in enumerate(weights):
            self.set(i, w)

    def set(self, i: int, weight: float) -> None:
        delta = weight - self.weights[i]
        self.positive += (weight > 0) - (self.weights[i] > 0)
        self.weights[i] = weight
        j = i + 1
        while j <= self.n:
            self.tree[j] += delta
            j += j & -j

    def total(self) -> float:
        s, j = 0.0, self.n
        while j > 0:
            s += self.tree[j]
            j -= j & -j
        return s

    def sample(self, rng: random.Random) -> int | None:
        total = self.total()
        if total <= 1e-9:
            return None
        target = rng.random() * total
        pos, step = 0, 1 << self.n.bit_length()
        while step:
            nxt = pos + step
            if nxt <= self.n and self.tree[nxt] <= target:
                target -= self.tree[nxt]
                pos = nxt
            step >>= 1
        return min(pos, self.n - 1) if self.weights[min(pos, self.n - 1)] > 0 else self._first()

    def _first(self) -> int | None:
        return next((i for i, w in enumerate(self.weights) if w > 0), None)


FULL_REASONS = ("no_room", "watermark", "backlog_full")
"""Why a healthy agent gets nothing in a round because it holds enough work already."""


class RoutingRound:
    """One routing round of one capability: agent-level filters and scores computed once,
    then a choice per task in O(log n) for unconstrained tasks."""

    def __init__(self, candidates: Sequence[Candidate], settings: Settings, now_ms: int,
                 rng: random.Random | None = None, probes: dict[str, int] | None = None,
                 filtered: dict[str, str] | None = None) -> None:
        self.settings = settings
        self.now = now_ms
        self.rng = rng or random.Random()
        self.probes = probes if probes is not None else {}
        self.filtered: dict[str, str] = dict(filtered or {})
        self.candidates = list(candidates)
        self.agents: list[Candidate] = []
        self.rooms: list[int] = []
        self.probe_only: list[bool] = []
        for c in candidates:
            reason, probe = gate(c, settings, now_ms, self.probes)
            r = 1 if probe else room(c, settings)
            if reason is None and r <= 0:
                reason = "no_room"
            if reason is not None:
                self.filtered[c.agent_id] = reason
                continue
            self.agents.append(c)
            self.rooms.append(r)
            self.probe_only.append(probe)
        self.index = {c.agent_id: i for i, c in enumerate(self.agents)}
        # Regions with a healthy agent, full or not: a task that prefers one of them waits for it.
        self.live_regions = {c.region for c in candidates
                             if c.region and not str(self.filtered.get(c.agent_id, "")).startswith(
                                 ("state:", "circuit_open", "ejected_slow"))}
        known = [c.latency_p50_ms for c in self.agents if c.latency_p50_ms is not None]
        self.best_p50 = min(known) if known else None
        self.cold = [self._is_cold(c) for c in self.agents]
        self.parts = [components(c, settings, now_ms, self.best_p50) for c in self.agents]
        self.scores = [score(p, settings) for p in self.parts]
        self.all_pool = WeightedPool(self.scores)
        self.warm_pool = WeightedPool(
            [0.0 if cold else s for s, cold in zip(self.scores, self.cold, strict=True)])
        self.reroutes = sum(1 for r in self.filtered.values() if r == "backlog_full")

    @property
    def capacity(self) -> int:
        return sum(self.rooms)

    def choose(self, task: ReadyTask) -> Choice | None:
        if not self.agents:
            return None
        low_priority = task.priority <= self.settings.cold_start_max_priority
        constrained = bool(task.region or task.version)
        if task.session_agent in self.index:
            i = self.index[task.session_agent]
            if self.rooms[i] > 0 and self._fits(i, task) and (low_priority or not self.cold[i]):
                return self._take(i, "session", self._eligible_count(task))
        if constrained:
            return self._choose_constrained(task, low_priority)
        pool = self.all_pool if low_priority else self.warm_pool
        why = "weighted"
        if pool.total() <= 1e-9 and not low_priority:
            pool, why = self.all_pool, "weighted:cold_only"  # no warm agent: better than waiting
        picked = pool.sample(self.rng)
        if picked is None:
            return None
        if task.last_agent_id and self.agents[picked].agent_id == task.last_agent_id:
            picked = self._avoid(pool, picked)
        return self._take(picked, why, pool.positive)

    def grants(self, limit: int) -> list[tuple[Choice, bool]]:
        """Up to `limit` inbox slots for tasks without constraints, in the order weighted
        random choice would fill them (each taken like a choice: its agent's room and score
        drop), each with whether it is for low-priority tasks only (its agent is cold). An
        agent allowed one probe gets the first slots, one each (the probe is out once granted,
        so the next task is the probe). A grant is a promise, not a delivery: the agents' loads
        are left as they were."""
        loads = [c.load.outstanding for c in self.agents]
        out: list[tuple[Choice, bool]] = []
        for i, probe in enumerate(self.probe_only):
            if probe and self.rooms[i] > 0 and len(out) < limit:
                out.append((self._take(i, "grant", self.all_pool.positive), self.cold[i]))
        while len(out) < limit:
            picked = self.all_pool.sample(self.rng)
            if picked is None:
                break
            out.append((self._take(picked, "grant", self.all_pool.positive), self.cold[picked]))
        for c, outstanding in zip(self.agents, loads, strict=True):
            c.load.outstanding = outstanding
        return out

    def pulls(self) -> list[tuple[Candidate, bool]]:
        """The agents that may take ready tasks without constraints themselves as they finish
        others, while the queue is deep (a standing pull, see broker/lua/complete.lua): the
        healthy ones whose circuit is closed and that are not ejected, with room or not (an
        agent kept full by the queue is the one that pulls), each with whether it is cold. An
        agent out on probation (one probe task) does not pull."""
        out = []
        for c in self.candidates:
            i = self.index.get(c.agent_id)
            if i is not None:
                if not self.probe_only[i]:
                    out.append((c, self.cold[i]))
            elif self.filtered.get(c.agent_id) in FULL_REASONS:
                out.append((c, self._is_cold(c)))
        return out

    def _is_cold(self, candidate: Candidate) -> bool:
        """Recovered less than cold_start_ms ago: low-priority tasks only, for now."""
        return (bool(candidate.recovered_at_ms)
                and self.now - candidate.recovered_at_ms < self.settings.cold_start_ms)

    def score_of(self, candidate: Candidate) -> float:
        """The agent's score in this round (computed here for one the round left out as full)."""
        i = self.index.get(candidate.agent_id)
        if i is not None:
            return self.scores[i]
        return score(components(candidate, self.settings, self.now, self.best_p50), self.settings)

    def _choose_constrained(self, task: ReadyTask, low_priority: bool) -> Choice | None:
        fits = [i for i in range(len(self.agents)) if self.rooms[i] > 0 and self._fits(i, task)]
        why = "weighted"
        if task.region and not task.region_strict:
            local = [i for i in fits if self.agents[i].region == task.region]
            if local:
                fits, why = local, "weighted:region"
            elif task.region in self.live_regions:
                return None  # the region's agents are busy, not gone: wait for them
            else:
                why = "weighted:region_elsewhere"
        warm = fits if low_priority else [i for i in fits if not self.cold[i]]
        if not warm and fits:
            warm, why = fits, why + ":cold_only"
        if task.last_agent_id and len(warm) > 1:
            warm = [i for i in warm if self.agents[i].agent_id != task.last_agent_id] or warm
        if not warm:
            return None
        weights = [self.all_pool.weights[i] for i in warm]
        i = self.rng.choices(warm, weights=weights)[0]
        return self._take(i, why, len(warm))

    def _fits(self, i: int, task: ReadyTask) -> bool:
        agent = self.agents[i]
        if task.region and task.region_strict and agent.region != task.region:
            return False
        return not (task.version and not satisfies(agent.version, task.version))

    def _eligible_count(self, task: ReadyTask) -> int:
        return sum(1 for i in range(len(self.agents)) if self.rooms[i] > 0 and self._fits(i, task))

    def _avoid(self, pool: WeightedPool, i: int) -> int:
        for _ in range(4):
            j = pool.sample(self.rng)
            if j is not None and j != i:
                return j
        others = [j for j, w in enumerate(pool.weights) if w > 0 and j != i]
        return self.rng.choice(others) if others else i

    def _take(self, i: int, why: str, eligible: int) -> Choice:
        agent = self.agents[i]
        chosen_score = self.scores[i]
        if self.probe_only[i]:
            why = "probe"
            self.probes[agent.agent_id] = self.now
        self.rooms[i] -= 1
        agent.load.outstanding += 1
        if self.rooms[i] <= 0:
            weight = 0.0
        else:
            self.parts[i] = components(agent, self.settings, self.now, self.best_p50)
            weight = score(self.parts[i], self.settings)
        self.scores[i] = weight
        self.all_pool.set(i, weight)
        self.warm_pool.set(i, 0.0 if self.cold[i] else weight)
        return Choice(agent.agent_id, why, round(chosen_score, 1), eligible)

    def snapshot(self, limit: int = 50) -> dict[str, Any]:
        """What this round saw, for `reach explain` (the best `limit` agents in full)."""
        ranked = sorted(range(len(self.agents)), key=lambda i: -self.scores[i])[:limit]
        by_reason: dict[str, list[str]] = {}
        for agent_id, reason in self.filtered.items():
            by_reason.setdefault(reason, []).append(agent_id)
        return {
            "at": self.now,
            "candidates": [
                {"agent_id": self.agents[i].agent_id, "score": round(score(self.parts[i], self.settings), 1),
                 "room": self.rooms[i], "cold": self.cold[i], "region": self.agents[i].region,
                 "version": self.agents[i].version,
                 **{k: round(v, 3) for k, v in self.parts[i].items()}}
                for i in ranked
            ],
            "more_candidates": max(0, len(self.agents) - limit),
            "filtered": {reason: sorted(ids)[:20] for reason, ids in sorted(by_reason.items())},
            "filtered_counts": {reason: len(ids) for reason, ids in sorted(by_reason.items())},
        }


def assign(tasks: Sequence[ReadyTask], candidates: Sequence[Candidate], settings: Settings,
           rng: random.Random | None = None, now_ms: int = 0) -> dict[str, list[str]]:
    """Agent id -> local ids for a batch (a convenience over RoutingRound); tasks nobody can
    take are left out and stay queued."""
    round_ = RoutingRound(candidates, settings, now_ms, rng)
    plan: dict[str, list[str]] = {}
    for task in tasks:
        choice = round_.choose(task)
        if choice is not None:
            plan.setdefault(choice.agent_id, []).append(task.local_id)
    return plan
