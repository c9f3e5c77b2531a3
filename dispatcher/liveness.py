"""Agents whose worker process is gone: what they held goes back at once, not when its leases
lapse.

A worker's Redis connections carry its agent's name (broker/keys.py, agent_client). When its
process dies (killed, crashed, out of memory) the kernel closes its sockets and Redis drops its
connections at once; a frozen process (SIGSTOP) or one cut off by the network keeps them, and
its tasks wait for their leases (lease_ms) as before. Once a second the watch lists Redis's
clients (CLIENT LIST, one call for all the capabilities of the dispatcher). An agent it saw
connected that has had no connection for gone_ms(), and no heartbeat meanwhile, is gone: every
task in its inbox goes back, the unread ones as they are and the ones it was running as a new
attempt (reclaim.lua: fenced, so a late report of the old one is refused), and it gets nothing
new until a connection of its shows again. (A live worker cut off by a Redis restart connects
again by its next heartbeat, within the wait.)

On Cluster every primary is listed (a worker holds connections to the node of its capability
and to the registry's). Inert where the names cannot be seen: behind a proxy, where CLIENT LIST
is refused (an ACL without it, some managed Redis): an agent never seen connected is left to
its leases.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import redis

from broker import inbox
from broker.infra import connection
from broker.infra.outages import TRANSIENT_ERRORS
from broker.keys import CapabilityKeys, RegistryKeys
from broker.settings import Settings
from dispatcher.candidates import without
from dispatcher.context import DispatcherContext
from dispatcher.routing import Candidate

log = logging.getLogger("reach.dispatcher")

CHECK_S = 1.0
"""How often Redis's clients are listed."""


def gone_ms(settings: Settings) -> int:
    """How long an agent seen connected must have had no connection, and sent no heartbeat,
    to be judged gone: a heartbeat and a second, 2 s at least."""
    return max(2000, settings.heartbeat_ms + 1000)


class AgentConnections:
    """The agents with a connection to Redis, as the last CLIENT LIST said; listed at most once
    per CHECK_S, whichever capability asks."""

    def __init__(self, ctx: DispatcherContext) -> None:
        self.ctx = ctx
        self._keys = RegistryKeys(ctx.settings.prefix)
        self._lock = asyncio.Lock()
        self._at = -CHECK_S
        self._agents: frozenset[str] | None = None
        self.off = False
        """Set for good where Redis refuses CLIENT LIST."""

    async def connected(self) -> frozenset[str] | None:
        """The agents connected now (None: not known, as after a failed listing)."""
        if self.off:
            return None
        async with self._lock:
            if time.monotonic() - self._at < CHECK_S:
                return self._agents
            self._at = time.monotonic()
            self._agents = None
            try:
                clients = await self._list()
            except redis.exceptions.ResponseError as exc:
                self.off = True
                log.warning("Redis refused CLIENT LIST (%s): the tasks of an agent whose process "
                            "died wait for their leases (lease_ms)", exc)
                return None
            except TRANSIENT_ERRORS:
                return None
            names = (self._keys.agent_of_client(str(c.get("name") or "")) for c in clients)
            self._agents = frozenset(agent for agent in names if agent)
            return self._agents

    async def _list(self) -> list[dict[str, Any]]:
        """Every client of the Redis (of each primary of a Cluster)."""
        client: Any = self.ctx.redis
        if not connection.is_cluster(client):
            return list(await client.client_list(_type="normal"))
        replies = await client.client_list(_type="normal", target_nodes=client.PRIMARIES)
        # (a dict by node, or one node's list where the cluster has a single primary)
        if isinstance(replies, dict):
            return [c for clients in replies.values() for c in clients]
        return list(replies)


class GoneWatch:
    """One capability's agents that are gone (see the module's docstring)."""

    def __init__(self, ctx: DispatcherContext, keys: CapabilityKeys, connections: AgentConnections) -> None:
        self.ctx = ctx
        self.keys = keys
        self.connections = connections
        self.next_at = 0.0
        self.seen: set[str] = set()
        """Agents of the capability seen connected."""
        self.absent: dict[str, tuple[float, int]] = {}
        """Agents seen before and not connected now: since when (monotonic), and their last
        heartbeat then (server ms)."""
        self.gone: set[str] = set()

    def due(self) -> bool:
        return time.monotonic() >= self.next_at

    async def run(self) -> int:
        """Hand on what the agents that are gone held; returns how many tasks moved."""
        self.next_at = time.monotonic() + CHECK_S
        connected = await self.connections.connected()
        if connected is None:
            self.absent.clear()  # (an absence counts only over listings that worked)
            return 0
        records = {r.agent_id: r for r in self.ctx.view.serving(self.keys.capability)}
        self.seen &= records.keys()
        self.gone &= records.keys()
        now, moved = time.monotonic(), 0
        for agent_id, record in records.items():
            if agent_id in connected:
                self.seen.add(agent_id)
                self.gone.discard(agent_id)
                self.absent.pop(agent_id, None)
                continue
            if agent_id not in self.seen or agent_id in self.gone:
                continue
            since, beat = self.absent.setdefault(agent_id, (now, record.last_seen_ms))
            if record.last_seen_ms > beat:  # (it heartbeat since: alive, connecting again)
                self.absent[agent_id] = (now, record.last_seen_ms)
            elif (now - since) * 1000 >= gone_ms(self.ctx.settings):
                moved += await self._hand_on(agent_id, now - since)
        # (those connected left it in the loop above; these no longer serve the capability)
        self.absent = {a: v for a, v in self.absent.items() if a in records}
        return moved

    async def _hand_on(self, agent_id: str, absent_s: float) -> int:
        ctx, capability = self.ctx, self.keys.capability
        moved = await inbox.release_unread(ctx.redis, ctx.scripts, ctx.settings, capability,
                                           agent_id, "agent gone")
        moved += await inbox.reclaim_lapsed(ctx.redis, ctx.scripts, ctx.settings, capability,
                                            agent_id, ctx.dispatcher_id, 0, "agent gone")
        self.gone.add(agent_id)
        del self.absent[agent_id]
        log.warning("agent %s has had no connection to Redis for %.1f s and sent no heartbeat: its "
                    "process is gone; %d task(s) of %s handed on", agent_id, absent_s, moved, capability)
        return moved

    def routable(self, candidates: list[Candidate], filtered: dict[str, str]
                 ) -> tuple[list[Candidate], dict[str, str]]:
        """The candidates without the agents that are gone (filtered as `gone`)."""
        if not self.gone:
            return candidates, filtered
        return without(candidates, filtered, self.gone, "gone")
