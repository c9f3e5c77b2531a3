"""What one gateway process holds: its Redis clients, the producer client, the one pub/sub
fan-out every event stream shares, and its API keys. Nothing else: Redis holds every task, so
gateways are stateless and run as many as you like."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any, TypeVar

from broker.client import AsyncReachClient
from broker.client.listener import TaskListener
from broker.infra import connection
from broker.infra.outages import TRANSIENT_ERRORS
from broker.scripts import AsyncScripts
from broker.settings import Settings
from gateway.apikeys import AuthMode
from gateway.auth import Auth, KeyCache, RateLimit
from gateway.results import ResultWaits

T = TypeVar("T")

STREAM_READS = 16
"""Event streams' record reads in flight at once (each takes a pooled Redis connection)."""
REDIS_CONNECTIONS = 64
"""The gateway's pooled Redis connections: a burst of requests waits for one rather than opening
a connection each (a thousand streams opened at once would overflow Redis's accept queue)."""


class GatewayState:
    def __init__(self, settings: Settings, auth_mode: AuthMode) -> None:
        self.settings = settings
        self.redis = connection.async_client(settings, max_connections=REDIS_CONNECTIONS)
        self.scripts = AsyncScripts(self.redis)
        self.client = AsyncReachClient(settings, redis_client=self.redis)
        self.listener = TaskListener(self.redis)
        """Every event stream's pub/sub subscription, on one connection (broker/client/listener.py)."""
        self.stream_reads = asyncio.Semaphore(STREAM_READS)
        self.results = ResultWaits(settings, self.scripts, self.listener)
        rate = RateLimit(settings, self.scripts) if settings.gateway_rate_limit > 0 else None
        self.auth = Auth(auth_mode, KeyCache(settings, self.redis), rate)
        self._sync: connection.SyncRedis | None = None

    def sync_redis(self) -> connection.SyncRedis:
        """A synchronous client for the operators' reads (broker/ops), run in threads."""
        if self._sync is None:
            self._sync = connection.sync_client(self.settings)
        return self._sync

    async def in_thread(self, read: Callable[[connection.SyncRedis], T]) -> T:
        return await asyncio.to_thread(read, self.sync_redis())

    async def close(self) -> None:
        with contextlib.suppress(*TRANSIENT_ERRORS, TimeoutError):
            await self.listener.close()
        with contextlib.suppress(*TRANSIENT_ERRORS, TimeoutError):
            await self.results.close()
        with contextlib.suppress(*TRANSIENT_ERRORS, TimeoutError):
            await self.client.close()  # (closes self.redis too)
        if self._sync is not None:
            self._sync.close()


def state_of(app: Any) -> GatewayState:
    state: GatewayState = app.state.gateway
    return state
