"""The Redis side of the dead-letter tools: one connection, the scripts, the server clock."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis

from broker.acl import denied, is_permission_error
from broker.errors import ReachError
from broker.ids import CAPABILITY_RE
from broker.infra import connection, outages
from broker.keys import CapabilityKeys, RegistryKeys
from broker.registry import server_ms
from broker.scripts import Scripts
from broker.settings import Settings


class Conn:
    """Settings, a synchronous Redis client and the registered scripts, shared by every part."""

    def __init__(self, settings: Settings, redis_client: connection.SyncRedis | None = None) -> None:
        self.settings = settings
        self._own = redis_client is None
        self.redis: Any = redis_client or connection.sync_client(settings)
        self.scripts = Scripts(self.redis)

    def close(self) -> None:
        if self._own:
            self.redis.close()

    def keys(self, capability: str) -> CapabilityKeys:
        return CapabilityKeys(self.settings.prefix, capability)

    def now_ms(self) -> int:
        """The Redis server's clock (every time in the DLQ is the server's)."""
        with self.errors():
            return server_ms(self.redis.time())

    def capabilities(self) -> list[str]:
        """Every capability the registry knows, sorted (never KEYS or SCAN)."""
        with self.errors():
            names = self.redis.smembers(RegistryKeys(self.settings.prefix).capabilities)
        return sorted(n for n in names if CAPABILITY_RE.match(n))

    @contextmanager
    def errors(self) -> Iterator[None]:
        """Redis being away is BrokerUnavailable, a refused command a ReachError (both exit 1 in
        the CLI, one line, no password shown)."""
        try:
            yield
        except outages.TRANSIENT_ERRORS as exc:
            raise outages.unavailable(exc, self.settings) from exc
        except redis.exceptions.ResponseError as exc:
            if is_permission_error(exc):  # (which role's rule allows it: broker/acl.py)
                raise denied(exc) from exc
            raise ReachError(f"Redis refused a command: {exc}") from exc
