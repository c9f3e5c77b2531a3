"""The dispatcher's picture of the fleet: which agents exist and which may take work now.

Refreshed when the registry announces a change (a wake-up message) and at every idle tick.
All ages are measured against the Redis server clock: each refresh reads TIME in the same
round trip as the records, and the offset to the local monotonic clock is kept in between.
"""

from __future__ import annotations

import time
from typing import Any

from broker.keys import RegistryKeys
from broker.registry import AgentRecord, AgentState, agent_state, server_ms
from broker.settings import Settings


class RegistryView:
    def __init__(self, settings: Settings, client: Any) -> None:
        self.settings = settings
        self._redis = client
        self._keys = RegistryKeys(settings.prefix)
        self.agents: dict[str, AgentRecord] = {}
        self._offset_ms = 0.0
        self.refreshed = False

    def now_ms(self) -> int:
        """The Redis server's time now, estimated from the last refresh."""
        return int(time.monotonic() * 1000 + self._offset_ms)

    async def refresh(self) -> None:
        pipe = self._redis.pipeline(transaction=False)
        pipe.time()
        pipe.zrange(self._keys.agents, 0, -1)
        now_reply, ids = await pipe.execute()
        self._offset_ms = server_ms(now_reply) - time.monotonic() * 1000
        pipe = self._redis.pipeline(transaction=False)
        for agent_id in ids:
            pipe.hgetall(self._keys.agent(agent_id))
        records = await pipe.execute() if ids else []
        agents = {}
        for agent_id, data in zip(ids, records, strict=True):
            record = AgentRecord.from_hash(data) if data else None
            if record is not None:
                agents[agent_id] = record
        self.agents = agents
        self.refreshed = True

    def state(self, record: AgentRecord) -> AgentState:
        return agent_state(record, self.now_ms(), self.settings)

    def ready_for(self, capability: str) -> list[AgentRecord]:
        """Agents that serve `capability` and may take new tasks now."""
        return [
            r for r in self.agents.values()
            if capability in r.capabilities and self.state(r) is AgentState.HEALTHY
        ]

    def capabilities(self) -> set[str]:
        out: set[str] = set()
        for record in self.agents.values():
            out.update(record.capabilities)
        return out
