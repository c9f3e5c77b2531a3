"""The dispatcher's picture of the fleet: which agents exist and which may take work now.

Refreshed when the registry announces a change (a wake-up message) and at every idle tick, and
incrementally: liveness for every agent comes from one sorted set (agent -> last heartbeat,
server clock), and only the records whose revision moved since the last refresh are read again
(the seeds' watch-storm lesson). Ages are measured against the Redis server clock: each refresh
reads TIME in the same round trip, and the offset to the local monotonic clock is kept.
"""

from __future__ import annotations

import time

from broker.infra.connection import AsyncRedis
from broker.keys import RegistryKeys
from broker.registry import SERVER_TIME_LUA, AgentRecord, AgentState, agent_state, server_ms
from broker.settings import Settings

FULL_REFRESH_EVERY_S = 60.0


class RegistryView:
    def __init__(self, settings: Settings, client: AsyncRedis) -> None:
        self.settings = settings
        self._redis = client
        self._keys = RegistryKeys(settings.prefix)
        self.agents: dict[str, AgentRecord] = {}
        self._offset_ms = 0.0
        self._rev = -1
        self._next_full = 0.0
        self.records_read = 0
        self.refreshed = False

    def now_ms(self) -> int:
        """The Redis server's time now, estimated from the last refresh."""
        return int(time.monotonic() * 1000 + self._offset_ms)

    async def refresh(self) -> None:
        full = self._rev < 0 or time.monotonic() >= self._next_full
        pipe = self._redis.pipeline(transaction=False)
        # The registry node's clock, through a keyed script: a Cluster pipeline refuses keyless
        # commands such as TIME.
        pipe.eval(SERVER_TIME_LUA, 1, self._keys.agents)
        pipe.zrange(self._keys.agents, 0, -1, withscores=True)
        pipe.get(self._keys.rev)
        pipe.zrangebyscore(self._keys.changes, f"({self._rev}", "+inf")
        now_reply, live, rev, changed = await pipe.execute()
        self._offset_ms = server_ms(now_reply) - time.monotonic() * 1000
        last_seen = {agent_id: int(score) for agent_id, score in live}
        to_read = list(last_seen) if full else [
            a for a in set(changed) | (set(last_seen) - set(self.agents)) if a in last_seen
        ]
        pipe = self._redis.pipeline(transaction=False)
        for agent_id in to_read:
            pipe.hgetall(self._keys.agent(agent_id))
        fresh = dict(zip(to_read, await pipe.execute(), strict=True)) if to_read else {}
        self.records_read += len(to_read)
        agents: dict[str, AgentRecord] = {}
        for agent_id, seen in last_seen.items():
            if agent_id in fresh:
                record = AgentRecord.from_hash(fresh[agent_id]) if fresh[agent_id] else None
            else:
                record = self.agents.get(agent_id)
            if record is not None:
                record.last_seen_ms = max(record.last_seen_ms, seen)
                agents[agent_id] = record
        self.agents = agents
        self._rev = int(rev or 0)
        if full:
            self._next_full = time.monotonic() + FULL_REFRESH_EVERY_S
        self.refreshed = True

    def state(self, record: AgentRecord) -> AgentState:
        return agent_state(record, self.now_ms(), self.settings)

    def ready_for(self, capability: str) -> list[AgentRecord]:
        """Agents that serve `capability` and may take new tasks now."""
        return [
            r for r in self.agents.values()
            if capability in r.capabilities and self.state(r) is AgentState.HEALTHY
        ]

    def serving(self, capability: str) -> list[AgentRecord]:
        return [r for r in self.agents.values() if capability in r.capabilities]

    def capabilities(self) -> set[str]:
        out: set[str] = set()
        for record in self.agents.values():
            out.update(record.capabilities)
        return out
