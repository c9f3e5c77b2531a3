"""Routing decisions a dispatcher leaves standing for the scripts to carry out (see
broker/protocol/grants.py): grants while the queue is empty, pulls for when tasks wait.

Grants: a round that finds the queue empty leaves its agents' remaining room as grants, in
weighted random order; submit.lua hands the next tasks without routing constraints straight to
them. A grant set no different from the standing one is not written again until a third of its
time to live has passed, or until submits used half of it. Grants stand only while the queue is
empty: a round that leaves tasks queued takes them back.

Pulls: every healthy agent whose circuit is closed holds a standing pull, and while tasks wait
its report of finished tasks takes the next plain tasks from the queue (complete.lua); so a
drain needs no dispatcher round per completion. They stand while the queue is empty too: the
first task that finds no grant left (every slot busy) waits for the fleet's next completion,
as in a pull queue, not for a round to notice the queue and write them first. Rewritten when
the set changes (an agent's circuit opened, it went cold, it left), else refreshed before it
expires.

Probes: an agent back from an open circuit (or an ejection) gets one probe task, which while
the queue is empty comes by grant. The round counts the probe as out once granted, so a probe
grant that a rewrite would drop unused is carried over by grant.lua; when the grants are taken
back, an unused probe is handed back to the dispatcher's rounds.
"""

from __future__ import annotations

import time

from broker.keys import CapabilityKeys
from broker.protocol.grants import Grant, Pull, grant_call, parse_grant, pulls_call
from dispatcher.context import DispatcherContext
from dispatcher.observations import Observations
from dispatcher.routing import RoutingRound, max_unread, prefetch
from dispatcher.snapshots import Snapshots

GRANT_TTL_TICKS = 3
"""Grants and pulls stand this many idle ticks unless a dispatcher refreshes them (it does
every tick)."""


class Grants:
    def __init__(self, ctx: DispatcherContext, keys: CapabilityKeys, observations: Observations,
                 snapshots: Snapshots) -> None:
        self.ctx = ctx
        self.capability = keys.capability
        self.observations = observations
        self.snapshots = snapshots
        self.written = 0
        self.left = 0
        """Grants this dispatcher wrote last, and how many of them submits have not used."""
        self.granted: list[tuple[str, bool]] = []
        """The grants standing (agent, low-priority only; sorted), as this dispatcher last
        wrote them."""
        self._granted_until = 0.0
        self._probe_grants: dict[str, int] = {}
        """Agents whose probe this dispatcher granted and, as far as it knows, no submit has
        taken yet, with the probe's time in the observations' probes."""
        self._pulls: list[tuple[str, int, bool]] = []
        """The standing pulls (agent, most unread, cold) as this dispatcher last wrote them."""
        self._pulls_until = 0.0

    @property
    def ttl_ms(self) -> int:
        return GRANT_TTL_TICKS * self.ctx.settings.idle_tick_ms

    def running_low(self) -> bool:
        """Submits used half of the grants this dispatcher wrote last: time to write them again."""
        return self.left * 2 < self.written

    def on_took(self, taken: int, left: int | None) -> bool:
        """A submit used grants (`left` standing after it; None from a producer that tells
        every hand-off). Returns whether a round should run now: once half of them are gone,
        or all are gone and this dispatcher wrote none (their writer may be gone)."""
        self.left = left if left is not None else self.left - taken
        return self.running_low() or (left == 0 and not self.written)

    def granted_agents(self) -> list[str]:
        return [agent_id for agent_id, _ in self.granted]

    async def grant(self, round_: RoutingRound | None) -> None:
        """Leave the round's remaining room as grants (or, with no round, take them back)."""
        grants, shape, probes, carry = await self._plan(round_)
        shape.sort()
        now = time.monotonic()
        if shape == self.granted and now < self._granted_until and not self.running_low():
            # (The standing set names these agents as this one would: a probe granted here is
            # the standing grant of its agent.)
            self._probe_grants.update(probes)
            return
        if not grants and not self.granted and not self._probe_grants:
            return
        looking = carry if grants else sorted(self._probe_grants)
        reply = parse_grant(await self.ctx.scripts(
            grant_call(self.ctx.settings, self.capability, grants, self.ttl_ms, looking)))
        unused = set(reply.unused_probes)
        carried: dict[str, int] = {}
        if grants:
            carried = {agent: self._probe_grants[agent] for agent in carry if agent in unused}
        else:
            # The grants are taken back: a probe they held unused never went out, and the
            # agent may have it from a dispatch round (else it would wait a lease for nothing).
            given = self.observations.probes
            for agent in unused:
                if given.get(agent) == self._probe_grants.get(agent):
                    del given[agent]
        self._probe_grants = {**carried, **probes}
        self.written = self.left = reply.standing
        self.granted = sorted([entry for entry in shape if entry[0] not in carry]
                              + [(agent, False) for agent in carried])
        self._granted_until = now + self.ttl_ms / 3000

    async def _plan(self, round_: RoutingRound | None
                    ) -> tuple[list[Grant], list[tuple[str, bool]], dict[str, int], list[str]]:
        """The grants a round leaves: (grants, their shape (agent, cold), the probes among
        them, the unused probe grants to carry over)."""
        grants: list[Grant] = []
        # Agent and cold flag: an agent back from a failure in the grants as before must have
        # its grants rewritten at once (low-priority only), not when the old ones are refreshed.
        shape: list[tuple[str, bool]] = []
        probes: dict[str, int] = {}
        if round_ is None:
            return grants, shape, probes, []
        round_id = await self.snapshots.of(round_)
        by_id = {c.agent_id: c for c in round_.agents}
        for choice, low_only in round_.grants(self.ctx.settings.dispatch_batch):
            c = by_id[choice.agent_id]
            unread = max_unread(c, self.ctx.settings)
            # (Used only while its slots and the prefetch it is allowed hold room: see
            # lua/_handoff.lua.)
            inflight = c.max_concurrency + prefetch(c, self.ctx.settings)
            grants.append(Grant(choice.agent_id, unread, round_id, choice.score, low_only, inflight))
            shape.append((choice.agent_id, low_only))
            if choice.why == "probe":
                probes[choice.agent_id] = self.observations.probes[choice.agent_id]
        if not grants:
            return grants, shape, probes, []
        # A probe granted before and not taken yet stays in the set (grant.lua): the round
        # counted it as out, so it names the agent no more. (Not for an agent the dispatcher
        # no longer sees serving, whatever its circuit.)
        present = {c.agent_id for c in round_.candidates}
        carry = sorted(agent for agent in self._probe_grants if agent in present and agent not in probes)
        shape += [(agent, False) for agent in carry]
        return grants, shape, probes, carry

    async def pull(self, round_: RoutingRound | None) -> None:
        """Let the agents the round found healthy (full or not) take ready tasks themselves as
        they finish others whenever tasks wait (None: no pulls)."""
        settings = self.ctx.settings
        standing = round_.pulls() if round_ is not None else []
        limits = {c.agent_id: max_unread(c, settings) for c, _ in standing}
        shape = sorted((c.agent_id, limits[c.agent_id], cold) for c, cold in standing)
        now = time.monotonic()
        if shape == self._pulls and (now < self._pulls_until or not shape):
            return
        pulls: dict[str, Pull] = {}
        if round_ is not None and standing:
            round_id = await self.snapshots.of(round_)
            for c, cold in standing:
                pulls[c.agent_id] = Pull(limits[c.agent_id], round_id, round_.score_of(c), cold)
        await self.ctx.scripts(pulls_call(settings, self.capability, pulls, self.ttl_ms))
        self._pulls = shape
        self._pulls_until = now + self.ttl_ms / 3000
