"""What the parts of a dispatcher share, made once before any of them: its settings, its Redis
connection and scripts, its picture of the registry, and the names it goes by."""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass

from broker.infra import connection
from broker.scripts import AsyncScripts
from broker.settings import Settings
from dispatcher.metrics import DispatcherMetrics
from dispatcher.registry_view import RegistryView


def new_dispatcher_id() -> str:
    return f"dispatcher-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"


@dataclass(eq=False)
class DispatcherContext:
    settings: Settings
    redis: connection.AsyncRedis
    scripts: AsyncScripts
    view: RegistryView
    dispatcher_id: str
    """Its consumer name in the intake groups and the claims it makes."""
    tag: str
    """A short name in the routing decisions it records (its log says which id it stands for)."""
    only: frozenset[str] | None = None
    """The capabilities it serves, if not all."""
    metrics: DispatcherMetrics | None = None
    """Its metrics, when it serves them."""

    @classmethod
    def connect(cls, settings: Settings, *, dispatcher_id: str | None = None,
                only: frozenset[str] | None = None,
                metrics: DispatcherMetrics | None = None) -> DispatcherContext:
        """A context on a new client (it connects at its first command)."""
        redis = connection.async_client(settings)
        return cls(settings, redis, AsyncScripts(redis), RegistryView(settings, redis),
                   dispatcher_id or new_dispatcher_id(), secrets.token_hex(3), only, metrics)

    def serves(self, capability: str) -> bool:
        return self.only is None or capability in self.only

    async def close(self) -> None:
        await self.redis.aclose()
