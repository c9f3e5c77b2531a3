"""The lease sweep: tasks whose lease lapsed (their agent died, froze or lost the network) are
claimed from their inbox and requeued as a new attempt (reclaim.lua), in every inbox of the
capability; and what an agent no longer registered left unread goes to other agents.

A lease is the idle time of the task's entry in its inbox's pending list: its worker renews it
every lease/3 (agent_worker/renewer.py) by claiming the entry back.
"""

from __future__ import annotations

import logging
import time

from broker import inbox
from broker.keys import AGENT_GROUP, CapabilityKeys
from broker.protocol.policy import active_sync_call
from dispatcher.context import DispatcherContext

log = logging.getLogger("reach.dispatcher")


class LeaseSweep:
    def __init__(self, ctx: DispatcherContext, keys: CapabilityKeys) -> None:
        self.ctx = ctx
        self.keys = keys
        self.capability = keys.capability
        self.next_at = 0.0
        self.reclaimed = 0

    def due(self) -> bool:
        return time.monotonic() >= self.next_at

    async def run(self) -> int:
        """Requeue tasks whose lease lapsed; returns how many moved."""
        ctx, settings = self.ctx, self.ctx.settings
        self.next_at = time.monotonic() + min(settings.lease_ms / 3000, 5.0)
        agents = sorted(str(agent) for agent in await ctx.redis.smembers(self.keys.inboxes))
        if not agents:
            return 0
        # (the count max_running is held against, set exactly: the scripts keep it in between)
        await ctx.scripts(active_sync_call(settings, self.capability))
        pipe = ctx.redis.pipeline(transaction=False)
        for agent_id in agents:
            pipe.xpending(self.keys.inbox(agent_id), AGENT_GROUP)
        summaries = await pipe.execute(raise_on_error=False)
        moved = 0
        for agent_id, summary in zip(agents, summaries, strict=True):
            if agent_id not in ctx.view.agents and ctx.view.refreshed:
                # Not registered (any more): whatever it left unread goes to other agents.
                moved += await inbox.release_unread(ctx.redis, ctx.scripts, settings,
                                                    self.capability, agent_id, "agent gone")
            if not isinstance(summary, dict) or not summary.get("pending"):
                continue
            moved += await inbox.reclaim_lapsed(
                ctx.redis, ctx.scripts, settings, self.capability, agent_id,
                ctx.dispatcher_id, settings.lease_ms, "lease lapsed")
        if moved:
            self.reclaimed += moved
            log.warning("%s: %d task(s) whose lease lapsed were handed on", self.capability, moved)
        return moved
