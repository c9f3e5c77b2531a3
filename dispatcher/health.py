"""Acting on what the registry says about agents.

After every registry refresh the dispatcher:
- records each agent's state transition once (agent_state.lua: with several dispatchers only
  the first to notice writes the event);
- gives back tasks still unread in the inboxes of agents that are draining or offline, so they
  go to other agents at once;
- reclaims the tasks an offline agent had read (their leases are as dead as the agent);
- prunes agents offline for longer than prune_after_ms.

How a heartbeat is judged (which state an agent is in) is broker/registry.py.
"""

from __future__ import annotations

import logging

from broker import inbox
from broker.keys import RegistryKeys
from broker.protocol.agents import agent_state_call, unbind_call
from broker.registry import AgentRecord, AgentState
from dispatcher.context import DispatcherContext

log = logging.getLogger("reach.dispatcher")


class HealthWatcher:
    def __init__(self, ctx: DispatcherContext) -> None:
        self.ctx = ctx

    async def react(self) -> None:
        view = self.ctx.view
        for record in list(view.agents.values()):
            state = view.state(record)
            if state.value != record.recorded_state:
                await self._record_transition(record, state)
            if state in (AgentState.OFFLINE, AgentState.DRAINING):
                await self._hand_back(record, state)
            if state is AgentState.OFFLINE and (
                record.heartbeat_age_ms(view.now_ms()) >= self.ctx.settings.prune_after_ms
            ):
                await self._prune(record)

    async def _record_transition(self, record: AgentRecord, state: AgentState) -> None:
        call = agent_state_call(self.ctx.settings, record.agent_id, record.recorded_state, state.value)
        if await self.ctx.scripts(call):
            level = logging.INFO if state in (AgentState.HEALTHY, AgentState.WARMING) else logging.WARNING
            log.log(level, "agent %s: %s -> %s", record.agent_id, record.recorded_state or "new",
                    state.value)
        if state is AgentState.HEALTHY and record.recorded_state in ("suspect", "offline", "not_ready"):
            # As agent_state.lua records it: routing treats the agent as cold from now on, not
            # only once the record is read again (grants are made before that).
            record.recovered_at_ms = self.ctx.view.now_ms()
        record.recorded_state = state.value

    async def _hand_back(self, record: AgentRecord, state: AgentState) -> None:
        ctx = self.ctx
        reason = f"agent {state.value}"
        for capability in record.capabilities:
            if not ctx.serves(capability):
                continue
            released = await inbox.release_unread(ctx.redis, ctx.scripts, ctx.settings,
                                                  capability, record.agent_id, reason)
            reclaimed = 0
            if state is AgentState.OFFLINE:
                reclaimed = await inbox.reclaim_lapsed(
                    ctx.redis, ctx.scripts, ctx.settings, capability, record.agent_id,
                    ctx.dispatcher_id, 0, reason)
            if released or reclaimed:
                log.warning("agent %s is %s: %d unread and %d running %s task(s) handed on",
                            record.agent_id, state.value, released, reclaimed, capability)

    async def _prune(self, record: AgentRecord) -> None:
        ctx = self.ctx
        rk = RegistryKeys(ctx.settings.prefix)
        log.info("pruning agent %s (offline longer than %d ms)", record.agent_id,
                 ctx.settings.prune_after_ms)
        # Capability side first, registry record last: a reader never sees "pruned" while the
        # agent's token is still accepted.
        for capability in record.capabilities:
            await ctx.scripts(unbind_call(ctx.settings, capability, record.agent_id))
        await ctx.redis.zrem(rk.agents, record.agent_id)
        await ctx.redis.zrem(rk.changes, record.agent_id)
        await ctx.redis.delete(rk.agent(record.agent_id))
        await ctx.redis.xadd(rk.events, {"type": "pruned", "agent_id": record.agent_id,
                                         "time": str(ctx.view.now_ms()), "detail": ""},
                             maxlen=10000, approximate=True)
        ctx.view.agents.pop(record.agent_id, None)
