"""Acting on what the registry says about agents.

After every registry refresh the dispatcher:
- records each agent's state transition once (agent_state.lua: with several dispatchers only
  the first to notice writes the event);
- gives back tasks still unread in the inboxes of agents that are draining or offline, so they
  go to other agents at once;
- reclaims the tasks an offline agent had read (their leases are as dead as the agent);
- prunes agents offline for longer than prune_after_ms.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from broker import inbox, protocol
from broker.keys import CapabilityKeys, RegistryKeys
from broker.registry import AgentRecord, AgentState

if TYPE_CHECKING:
    from dispatcher.service import Dispatcher

log = logging.getLogger("reach.dispatcher")


class HealthWatcher:
    def __init__(self, dispatcher: Dispatcher) -> None:
        self.d = dispatcher

    async def react(self) -> None:
        for record in list(self.d.view.agents.values()):
            state = self.d.view.state(record)
            if state.value != record.recorded_state:
                await self._record_transition(record, state)
            if state in (AgentState.OFFLINE, AgentState.DRAINING):
                await self._hand_back(record, state)
            if state is AgentState.OFFLINE and (
                record.heartbeat_age_ms(self.d.view.now_ms()) >= self.d.settings.prune_after_ms
            ):
                await self._prune(record)

    async def _record_transition(self, record: AgentRecord, state: AgentState) -> None:
        call = protocol.agent_state_call(self.d.settings, record.agent_id, record.recorded_state,
                                         state.value)
        if await self.d.scripts(call):
            level = logging.INFO if state in (AgentState.HEALTHY, AgentState.WARMING) else logging.WARNING
            log.log(level, "agent %s: %s -> %s", record.agent_id, record.recorded_state or "new",
                    state.value)
        if state is AgentState.HEALTHY and record.recorded_state in ("suspect", "offline", "not_ready"):
            # As agent_state.lua records it: routing treats the agent as cold from now on, not
            # only once the record is read again (grants are made before that).
            record.recovered_at_ms = self.d.view.now_ms()
        record.recorded_state = state.value

    async def _hand_back(self, record: AgentRecord, state: AgentState) -> None:
        settings = self.d.settings
        reason = f"agent {state.value}"
        for capability in record.capabilities:
            if capability not in self.d.loops and self.d.only is not None:
                continue
            released = await inbox.release_unread(self.d.redis, self.d.scripts, settings,
                                                  capability, record.agent_id, reason)
            reclaimed = 0
            if state is AgentState.OFFLINE:
                reclaimed = await inbox.reclaim_lapsed(
                    self.d.redis, self.d.scripts, settings, capability, record.agent_id,
                    self.d.dispatcher_id, 0, reason)
            if released or reclaimed:
                log.warning("agent %s is %s: %d unread and %d running %s task(s) handed on",
                            record.agent_id, state.value, released, reclaimed, capability)

    async def _prune(self, record: AgentRecord) -> None:
        settings = self.d.settings
        rk = RegistryKeys(settings.prefix)
        log.info("pruning agent %s (offline longer than %d ms)", record.agent_id,
                 settings.prune_after_ms)
        # Capability side first, registry record last: a reader never sees "pruned" while the
        # agent's token is still accepted.
        for capability in record.capabilities:
            ck = CapabilityKeys(settings.prefix, capability)
            await self.d.redis.hdel(ck.tokens, record.agent_id, f"draining:{record.agent_id}")
            if not await self.d.redis.xlen(ck.inbox(record.agent_id)):
                await self.d.redis.delete(ck.inbox(record.agent_id))
                await self.d.redis.srem(ck.inboxes, record.agent_id)
        await self.d.redis.zrem(rk.agents, record.agent_id)
        await self.d.redis.zrem(rk.changes, record.agent_id)
        await self.d.redis.delete(rk.agent(record.agent_id))
        await self.d.redis.xadd(rk.events, {"type": "pruned", "agent_id": record.agent_id,
                                            "time": str(self.d.view.now_ms()), "detail": ""},
                                maxlen=10000, approximate=True)
        self.d.view.agents.pop(record.agent_id, None)
