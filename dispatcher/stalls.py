"""Agents that stopped reading their inbox: what waits unread there goes back to the queue.

A live agent reads a new entry as soon as one of its slots is free (its reader blocks on the
inbox for as many entries as it has free slots, and a report that frees slots reads in the same
round trip). An entry that stays unread for UNREAD_MS while the agent has a free slot and its
inbox does not move (nothing read, nothing finished, over a whole check) therefore says that the
agent stopped reading: it died, froze, or its loop is stuck. Its heartbeat says so only after
suspect_after_ms (15 s by default), and until then an agent killed while it had free slots
keeps taking its share of new tasks (grants, rounds), each stuck there until it is offline (30
s). The dispatcher takes every unread entry of such an agent back (release.lua: atomically, and
only entries the agent has not read, so it never saw them) and gives the agent nothing new
until it shows life: its inbox moves, or it heartbeats with its loop having progressed since.
An entry behind busy slots (a prefetch, or one that reached a full agent by a grant written
before its slots filled) waits for the agent's next free slot; once the agent has finished and
read nothing for BUSY_FACTOR times its time per task (and UNREAD_MS at least), it is taken back
likewise: a dead agent that was running a task in every slot looks just so, and a live one
whose every slot is held that long is the wrong place for it too (its mark goes with its next
finished task).

The check reads each healthy agent's consumer group (XINFO GROUPS) every CHECK_MS (at least a
ms per agent), and the oldest unread entry of an agent whose inbox did not move (XRANGE).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from broker import inbox
from broker.keys import CapabilityKeys
from broker.protocol.health import AgentHealth
from broker.registry import AgentRecord, AgentState
from dispatcher.candidates import usable_slots, without
from dispatcher.context import DispatcherContext
from dispatcher.routing import Candidate, judged_speed

log = logging.getLogger("reach.dispatcher")

UNREAD_MS = 250
"""An entry unread this long while its agent has a free slot is taken back (see above)."""
BUSY_FACTOR = 5
"""... and, while every slot of the agent is busy, this many times its time per task."""
CHECK_MS = 100
"""How often the inboxes are looked at (at least one ms per agent)."""

Looking = tuple[AgentRecord, tuple[int, str], int]
"""An agent whose inbox did not move, its group, and how long its oldest unread entry may wait
(0: it is marked)."""
Mark = tuple[int, int, str]
"""When an agent's unread tasks were taken back (server ms), and its group's pending count and
last-delivered id then: it shows life once either moved."""


def _entry_ms(entry_id: str) -> int:
    return int(entry_id.split("-", 1)[0])


class StallWatch:
    def __init__(self, ctx: DispatcherContext, keys: CapabilityKeys,
                 health_of: Callable[[str], AgentHealth | None] = lambda _: None) -> None:
        self.ctx = ctx
        self.keys = keys
        self.health_of = health_of
        """An agent's health as the dispatcher keeps it (its told speed)."""
        self.next_at = 0.0
        self.marked: dict[str, Mark] = {}
        """Agents that stopped reading, until they show life: routing gives them nothing."""
        self.seen: dict[str, tuple[tuple[int, str], int]] = {}
        """Each agent's group (pending, last-delivered id) at the last check, and since when
        (server ms) it has not moved."""

    def due(self) -> bool:
        return time.monotonic() >= self.next_at

    async def run(self) -> int:
        """Take back the unread tasks of agents that stopped reading; returns how many."""
        view = self.ctx.view
        records = [r for r in view.serving(self.keys.capability) if view.state(r) is AgentState.HEALTHY]
        self.next_at = time.monotonic() + max(CHECK_MS, len(records)) / 1000
        healthy = {r.agent_id for r in records}
        self.marked = {agent: mark for agent, mark in self.marked.items() if agent in healthy}
        if not records:
            return 0
        pipe = self.ctx.redis.pipeline(transaction=False)
        for record in records:
            pipe.xinfo_groups(self.keys.inbox(record.agent_id))
        groups = [inbox.agent_group(reply) for reply in await pipe.execute(raise_on_error=False)]
        now = self.ctx.view.now_ms()
        looking: list[Looking] = []
        seen, self.seen = self.seen, {}
        for record, group in zip(records, groups, strict=True):
            if group is None:
                continue
            agent_id = record.agent_id
            before = seen.get(agent_id)
            since = before[1] if before is not None and before[0] == group else now
            self.seen[agent_id] = (group, since)
            mark = self.marked.get(agent_id)
            if mark is not None:
                if self._alive(record, mark, group):
                    del self.marked[agent_id]
                else:
                    looking.append((record, group, 0))
            elif before is not None and before[0] == group:
                # (Still since the last check: it read nothing, finished nothing; with every
                # slot busy, for as long as an entry may wait.)
                free = group[0] < usable_slots(record)
                patience = UNREAD_MS if free else self._busy_patience(record)
                if patience is not None and (free or now - since >= patience):
                    looking.append((record, group, patience))
        return await self._take_back(looking, now) if looking else 0

    def _busy_patience(self, record: AgentRecord) -> int | None:
        """How long an entry may wait unread behind the agent's busy slots: BUSY_FACTOR times
        its time per task, UNREAD_MS at least (None while its time per task is not known)."""
        p50 = record.stats.get("latency_p50_ms")
        p50_ms = float(p50) if isinstance(p50, int | float) else None
        ms = judged_speed(self.health_of(record.agent_id), p50_ms)
        if ms is None or ms <= 0:
            return None
        return max(UNREAD_MS, int(BUSY_FACTOR * ms))

    def routable(self, candidates: list[Candidate], filtered: dict[str, str]
                 ) -> tuple[list[Candidate], dict[str, str]]:
        """The candidates without the agents that stopped reading (filtered as `not_reading`)."""
        if not self.marked:
            return candidates, filtered
        return without(candidates, filtered, self.marked, "not_reading")

    def _alive(self, record: AgentRecord, mark: Mark, group: tuple[int, str]) -> bool:
        """Whether a marked agent showed life: its inbox moved, or it heartbeat with its loop
        having progressed since the mark and a slot free (not every one held by a handler
        that ran past its timeout)."""
        since, pending, last = mark
        if group != (pending, last):
            return True
        age = record.stats.get("loop_progress_age_ms")
        progressed = record.last_seen_ms - (age if isinstance(age, int | float) else 0)
        return record.last_seen_ms > since and progressed > since and pending < usable_slots(record)

    async def _take_back(self, looking: list[Looking], now: int) -> int:
        """Take back the unread entries of the agents whose oldest one waited its patience
        (an agent marked already: whatever reached it since, e.g. by a grant written before
        the mark, at once)."""
        pipe = self.ctx.redis.pipeline(transaction=False)
        for record, (_, last), _ in looking:
            pipe.xrange(self.keys.inbox(record.agent_id), min=f"({last}", max="+", count=1)
        oldest = await pipe.execute(raise_on_error=False)
        moved = 0
        for (record, group, patience), entries in zip(looking, oldest, strict=True):
            if not isinstance(entries, list) or not entries:
                continue
            marked = record.agent_id in self.marked
            if not marked and now - _entry_ms(str(entries[0][0])) < patience:
                continue
            released = await inbox.release_unread(self.ctx.redis, self.ctx.scripts, self.ctx.settings,
                                                  self.keys.capability, record.agent_id,
                                                  "agent not reading")
            moved += released
            if not marked:
                # (With its group as it is now: the release moved no entry it has read.)
                self.marked[record.agent_id] = (now, group[0], group[1])
                log.warning("agent %s left %s task(s) unread for %d ms: %d handed on, and no "
                            "new ones until it reads again", record.agent_id,
                            self.keys.capability, patience, released)
        return moved
