"""Tasks no agent could take: a capability that has had no agent able to take work (healthy or
warming) for its no-agent timeout fails the tasks that waited that long, as `no_agent_timeout`,
so that a task for a capability nobody serves (a typo, a fleet that is gone) fails visibly
instead of waiting for ever. A backlog that live agents work through never fails this way.

When the dispatchers first see the capability unserved, its stats hash records the time
(`unserved_since`; the first dispatcher's stands), and the field goes once an able agent is
back; no_agent.lua fails a queued task only while the field says the capability has been
unserved since before the cutoff, so it never fails a task an agent has come for.
"""

from __future__ import annotations

import math
import time
from typing import Any

from broker.keys import CapabilityKeys
from broker.policy import Policy
from broker.protocol.lifecycle import no_agent_call
from broker.protocol.queue_score import decode
from broker.registry import AgentState
from dispatcher.context import DispatcherContext

CHECK_EVERY_S = 1.0
BATCH = 200
UNSERVED_FIELD = "unserved_since"
ABLE = (AgentState.HEALTHY, AgentState.WARMING)
MAX_PRIORITY = 9


class NoAgentWatch:
    def __init__(self, ctx: DispatcherContext, keys: CapabilityKeys) -> None:
        self.ctx = ctx
        self.keys = keys
        self.capability = keys.capability
        self._next = 0.0
        self._marked: bool | None = None
        """Whether this dispatcher last found the capability unserved (None: not looked yet)."""
        self.failed = 0

    def served(self) -> bool:
        view = self.ctx.view
        return any(self.capability in r.capabilities and view.state(r) in ABLE
                   for r in view.agents.values())

    async def run(self, policy: Policy) -> int:
        """Look (at most once a second); returns how many tasks failed."""
        if time.monotonic() < self._next:
            return 0
        self._next = time.monotonic() + CHECK_EVERY_S
        redis = self.ctx.redis
        if self.served():
            if self._marked is not False:
                await redis.hdel(self.keys.stats, UNSERVED_FIELD)
                self._marked = False
            return 0
        now = self.ctx.view.now_ms()
        pipe = redis.pipeline(transaction=False)
        pipe.hsetnx(self.keys.stats, UNSERVED_FIELD, now)
        pipe.hget(self.keys.stats, UNSERVED_FIELD)
        _, since = await pipe.execute()
        self._marked = True
        nat = int(policy["no_agent_timeout_ms"])
        cutoff = now - nat
        if nat <= 0 or since is None or int(since) > cutoff:
            return 0
        local_ids = await self._waited_since(cutoff, int(policy["aging_ms"]))
        if not local_ids:
            return 0
        failed = int(await self.ctx.scripts(
            no_agent_call(self.ctx.settings, self.capability, nat, local_ids)))
        self.failed += failed
        if len(local_ids) == BATCH:
            self._next = 0.0  # (more may be due)
        return failed

    async def _waited_since(self, cutoff: int, aging_ms: int) -> list[str]:
        """Queued tasks that became ready at or before `cutoff`, by their queue score (the
        script checks each record's queued_at)."""
        highest = cutoff + MAX_PRIORITY * aging_ms + 1
        head: Any = await self.ctx.redis.zrangebyscore(
            self.keys.queue, "-inf", highest, start=0, num=BATCH, withscores=True)
        out = []
        for member, score in head:
            priority, _ = decode(float(score))
            if math.floor(float(score)) + priority * aging_ms <= cutoff:
                out.append(str(member))
        return out
