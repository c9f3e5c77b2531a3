"""One routing round of one capability: agent-level filters and scores computed once, then a
choice per task in O(log n) for unconstrained tasks; grants and pulls are the same choices
taken ahead of time. Agents slower than the fleet (see rules.py) are the overflow: a task goes
to one only when no faster agent has room, and only once it has waited in the queue twice as
long as that agent is slower than the fleet per task."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from broker.settings import Settings
from broker.versions import satisfies
from dispatcher.routing.model import Candidate, Choice, ReadyTask
from dispatcher.routing.pool import WeightedPool
from dispatcher.routing.rules import (
    RECHECK_MS,
    components,
    fleet_speed,
    gate,
    room,
    score,
    slower_than_fleet,
    speed,
)

FULL_REASONS = ("no_room", "watermark", "backlog_full")
OVERFLOW_WAIT = 2.0
"""A task goes to an agent slower than the fleet once it has waited this many times as long as
that agent is slower per task. (The speeds are medians: under a heavy tail an agent's mean is
longer, by 1.6 x for LLM-like times; and a task sent to a slow agent cannot come back, while a
queue that a stall of the machine filled drains as fast as it filled.)"""
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
        self.fleet_ms = fleet_speed(candidates)
        self.agents: list[Candidate] = []
        self.rooms: list[int] = []
        self.probe_only: list[bool] = []
        self.slow: list[bool] = []
        """Slower than the fleet and not due for a recheck: only where faster agents have no room."""
        self.slow_ids: set[str] = set()
        """Every candidate slower than the fleet (eligible or not, rechecked or not)."""
        for c in candidates:
            self._admit(c)
        self.index = {c.agent_id: i for i, c in enumerate(self.agents)}
        # Regions with a healthy agent, full or not: a task that prefers one of them waits for it.
        self.live_regions = {c.region for c in candidates
                             if c.region and not str(self.filtered.get(c.agent_id, "")).startswith(
                                 ("state:", "circuit_open", "ejected_slow"))}
        known = [ms for c in self.agents if (ms := speed(c)) is not None]
        self.best_ms = min(known) if known else None
        self.cold = [self._is_cold(c) for c in self.agents]
        self.parts = [components(c, settings, now_ms, self.best_ms, c.agent_id in self.slow_ids)
                      for c in self.agents]
        self.scores = [score(p, settings) for p in self.parts]
        self._pools()
        self.reroutes = sum(1 for r in self.filtered.values() if r == "backlog_full")

    def _admit(self, c: Candidate) -> None:
        """Filter one candidate, or take it in with its room for this round."""
        reason, probe = gate(c, self.settings, self.now, self.probes)
        slow = slower_than_fleet(c, self.settings, self.fleet_ms)
        r = 1 if probe else room(c, self.settings)
        if slow:
            self.slow_ids.add(c.agent_id)
            # Its free slots only; and one task to measure it again once it is idle (after a
            # second, or its own time per task: a slow agent spends at most half its time so).
            idle_ms = self.now - c.health.last_success_ms
            recheck = c.load.outstanding == 0 and idle_ms >= max(RECHECK_MS, c.health.speed_ms)
            r = 1 if recheck and reason is None else min(r, c.max_concurrency - c.load.outstanding)
            slow = not recheck
        if reason is None and r <= 0:
            reason = "no_room"
        if reason is not None:
            self.filtered[c.agent_id] = reason
            return
        self.agents.append(c)
        self.rooms.append(r)
        self.probe_only.append(probe)
        self.slow.append(slow)

    def _pools(self) -> None:
        fast = self.scores
        if self.slow_ids:
            fast = [0.0 if slow else s for s, slow in zip(self.scores, self.slow, strict=True)]
        self.all_pool = WeightedPool(fast)
        """The agents not slower than the fleet (cold or not); `warm_pool` those not cold."""
        self.warm_pool = WeightedPool(
            [0.0 if cold else s for s, cold in zip(fast, self.cold, strict=True)])
        self._plain_faster_later: bool | None = None
        self.overflow_closed = False
        self.slow_idx = [i for i, slow in enumerate(self.slow) if slow]
        """The agents that are the overflow, and how long a task waits before one takes it:
        OVERFLOW_WAIT x as long as the agent is slower than the fleet per task."""
        self.overflow_after = {i: OVERFLOW_WAIT * (self.agents[i].health.speed_ms - (self.fleet_ms or 0.0))
                               for i in self.slow_idx}

    @property
    def capacity(self) -> int:
        """The tasks this round may still place: once a plain task was too fresh for the
        agents slower than the fleet, their room no longer counts (else a round would read a
        deep queue to its end for them)."""
        if self.overflow_closed:
            return sum(r for r, slow in zip(self.rooms, self.slow, strict=True) if not slow)
        return sum(self.rooms)

    def choose(self, task: ReadyTask) -> Choice | None:
        if not self.agents:
            return None
        low_priority = task.priority <= self.settings.cold_start_max_priority
        constrained = bool(task.region or task.version)
        if task.session_agent in self.index:
            i = self.index[task.session_agent]
            if (self.rooms[i] > 0 and self._fits(i, task) and (low_priority or not self.cold[i])
                    and not self.slow[i]):
                return self._take(i, "session", self._eligible_count(task))
        if constrained:
            return self._choose_constrained(task, low_priority)
        pool = self.all_pool if low_priority else self.warm_pool
        why = "weighted"
        if pool.total() <= 1e-9 and not low_priority:
            pool, why = self.all_pool, "weighted:cold_only"  # no warm agent: better than waiting
        if pool.total() <= 1e-9 and self.slow_idx:
            choice = self._overflow(task, self.slow_idx, "weighted", self._faster_later(task))
            # (The tasks behind this one in the queue waited less: the round stops reading.)
            self.overflow_closed = choice is None
            return choice
        picked = pool.sample(self.rng)
        if picked is None:
            return None
        if task.last_agent_id and self.agents[picked].agent_id == task.last_agent_id:
            picked = self._avoid(pool, picked)
        return self._take(picked, why, pool.positive)

    def grants(self, limit: int) -> list[tuple[Choice, bool]]:
        """Up to `limit` inbox slots for tasks without constraints, in the order weighted
        random choice would fill them (each taken like a choice: its agent's room and score
        drop), free slots before prefetch ones, each with whether it is for low-priority tasks
        only (its agent is cold). An
        agent allowed one probe gets the first slots, one each (the probe is out once granted,
        so the next task is the probe). A grant is a promise, not a delivery: the agents' loads
        are left as they were."""
        loads = [c.load.outstanding for c in self.agents]
        free = [max(0, c.max_concurrency - c.load.outstanding) for c in self.agents]
        out: list[tuple[Choice, bool]] = []
        for i, probe in enumerate(self.probe_only):
            if probe and self.rooms[i] > 0 and len(out) < limit:
                out.append((self._take(i, "grant", self.all_pool.positive), self.cold[i]))
        # (None to an agent slower than the fleet: a grant is for a task that did not wait.)
        later: list[tuple[Choice, bool]] = []
        while len(out) + len(later) < limit:
            picked = self.all_pool.sample(self.rng)
            if picked is None:
                break
            grant = (self._take(picked, "grant", self.all_pool.positive), self.cold[picked])
            # Free slots first, each agent's prefetch after them all: a task starts at once
            # in a free slot, while in a prefetch slot it waits for one of that agent's tasks.
            free[picked] -= 1
            (out if free[picked] >= 0 else later).append(grant)
        for c, outstanding in zip(self.agents, loads, strict=True):
            c.load.outstanding = outstanding
        return out + later

    def pulls(self) -> list[tuple[Candidate, bool]]:
        """The agents that may take ready tasks without constraints themselves as they finish
        others, while the queue is deep (a standing pull, see broker/lua/complete.lua): the
        healthy ones whose circuit is closed and that are not ejected, with room or not (an
        agent kept full by the queue is the one that pulls), each with whether it is cold. An
        agent out on probation (one probe task) does not pull, nor one slower than the fleet
        (a queued task waits less for a faster agent's next free slot)."""
        out = []
        for c in self.candidates:
            if c.agent_id in self.slow_ids:
                continue
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
        return score(components(candidate, self.settings, self.now, self.best_ms,
                                candidate.agent_id in self.slow_ids), self.settings)

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
        faster = [i for i in fits if not self.slow[i]]
        if not faster:
            return self._overflow(task, fits, why, self._faster_later(task))
        fits = faster
        warm = fits if low_priority else [i for i in fits if not self.cold[i]]
        if not warm and fits:
            warm, why = fits, why + ":cold_only"
        if task.last_agent_id and len(warm) > 1:
            warm = [i for i in warm if self.agents[i].agent_id != task.last_agent_id] or warm
        if not warm:
            return None
        weights = [self.scores[i] for i in warm]
        i = self.rng.choices(warm, weights=weights)[0]
        return self._take(i, why, len(warm))

    def _overflow(self, task: ReadyTask, slow: list[int], why: str, wait: bool) -> Choice | None:
        """The task for an agent slower than the fleet (among `slow`, those with room), once
        it has waited long enough (OVERFLOW_WAIT; weighted by score), else None: it waits
        for a faster agent's next free slot, sooner than the slow one would finish it. (At once
        when no faster agent could take it later: `wait` False.)"""
        waited = self.now - task.ready_at_ms if task.ready_at_ms and wait else float("inf")
        ready = [i for i in slow if self.overflow_after[i] <= waited and self.rooms[i] > 0]
        if not ready:
            return None
        i = self.rng.choices(ready, weights=[self.scores[i] for i in ready])[0]
        return self._take(i, why + ":slow_only", len(ready))

    def _faster_later(self, task: ReadyTask) -> bool:
        """Whether an agent not slower than the fleet, eligible now or only full, can take the
        task (its region and version; for a plain task worked out once a round)."""
        plain = not (task.region or task.version)
        if plain and self._plain_faster_later is not None:
            return self._plain_faster_later
        found = any(c.agent_id not in self.slow_ids and self._agent_fits(c, task)
                    and (c.agent_id in self.index or self.filtered.get(c.agent_id) in FULL_REASONS)
                    for c in self.candidates)
        if plain:
            self._plain_faster_later = found
        return found

    def _fits(self, i: int, task: ReadyTask) -> bool:
        return self._agent_fits(self.agents[i], task)

    @staticmethod
    def _agent_fits(agent: Candidate, task: ReadyTask) -> bool:
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
            self.parts[i] = components(agent, self.settings, self.now, self.best_ms,
                                       agent.agent_id in self.slow_ids)
            weight = score(self.parts[i], self.settings)
        self.scores[i] = weight
        if not self.slow[i]:
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
                 "room": self.rooms[i], "cold": self.cold[i],
                 "slow": self.agents[i].agent_id in self.slow_ids, "region": self.agents[i].region,
                 "version": self.agents[i].version,
                 **{k: round(v, 3) for k, v in self.parts[i].items()}}
                for i in ranked
            ],
            "more_candidates": max(0, len(self.agents) - limit),
            "fleet_speed_ms": None if self.fleet_ms is None else round(self.fleet_ms, 1),
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


ROUND_TASKS_PER_AGENT = 4
MAX_ROUND_TASKS = 4096
"""A round with many agents takes up to ROUND_TASKS_PER_AGENT ready tasks per eligible agent
(at most MAX_ROUND_TASKS), not just dispatch_batch."""


def round_tasks(round_: RoutingRound, settings: Settings) -> int:
    """How many ready tasks a round reads. Setting a round up costs time per agent, and so does
    each agent's part of a dispatch call: with many agents, take several tasks per eligible
    agent (as room allows) so that cost is spread over as many decisions."""
    return min(round_.capacity, max(settings.dispatch_batch,
                                    min(ROUND_TASKS_PER_AGENT * len(round_.agents), MAX_ROUND_TASKS)))
