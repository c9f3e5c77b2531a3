"""Who may call the API: Bearer API keys (gateway/apikeys.py) and the role each needs.

    AuthMode.AUTO      loopback addresses: open while no key exists; once one does, keys are needed
    AuthMode.REQUIRED  any other address: a key is needed (no key exists: every call is refused)
    AuthMode.OFF       `--insecure-no-auth`: no checks at all

The keys' hashes are cached for KEYS_TTL_S (a revoked key stops working within that), and a
presented key's SHA-256 is compared with each of them in constant time. A key is never logged.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from broker.infra.connection import AsyncRedis
from broker.infra.outages import TRANSIENT_ERRORS
from broker.protocol.gateway_rate import burst_of, gateway_rate_call, parse_gateway_rate
from broker.scripts import AsyncScripts
from broker.settings import Settings
from gateway.apikeys import AuthMode, KeyRecord, Role, key_sha256, load_keys
from gateway.errors import ApiError

log = logging.getLogger("reach.gateway")

KEYS_TTL_S = 1.0
_bearer = HTTPBearer(auto_error=False, description="An API key made with `reach keys create`")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


class KeyCache:
    """The API keys' hashes as Redis held them at most KEYS_TTL_S ago."""

    def __init__(self, settings: Settings, client: AsyncRedis) -> None:
        self.settings = settings
        self.client = client
        self._keys: dict[str, KeyRecord] | None = None
        self._until = 0.0
        self._started = 0.0
        """When the last load began (one that began before a key was made may not hold it)."""
        self._loading: asyncio.Task[dict[str, KeyRecord]] | None = None

    async def keys(self, newer_than: float = 0.0) -> dict[str, KeyRecord]:
        """The keys, as read by a load begun after `newer_than` (monotonic clock)."""
        now = time.monotonic()
        if self._keys is not None and now < self._until and self._started >= newer_than:
            return self._keys
        if self._loading is None or self._loading.done() or self._started < newer_than:
            self._started = now  # (one load for every caller that comes meanwhile)
            self._loading = asyncio.create_task(load_keys(self.client, self.settings))
        loading = self._loading
        try:
            keys = await asyncio.shield(loading)
        except TRANSIENT_ERRORS:
            if self._keys is None:
                raise
            log.warning("cannot reload the API keys; using those read before")
            return self._keys
        if loading is self._loading:
            self._keys, self._until = keys, self._started + KEYS_TTL_S
        return keys

    async def find(self, key: str) -> KeyRecord | None:
        asked = time.monotonic()
        presented = key_sha256(key).encode()
        found = _match(presented, await self.keys())
        if found is None and self._started < asked:
            # (a key made a moment ago works at once; a wrong key costs one read of the hash)
            found = _match(presented, await self.keys(newer_than=asked))
        return found


def _match(presented: bytes, keys: dict[str, KeyRecord]) -> KeyRecord | None:
    found = None
    for sha, record in keys.items():  # (every one compared: no early exit)
        if hmac.compare_digest(presented, sha.encode()):
            found = record
    return found


class RateLimit:
    """gateway_rate_limit: a token bucket per API key (per client address for calls without a
    key), kept in Redis so that it holds across gateway processes (broker/protocol/gateway_rate.py)."""

    def __init__(self, settings: Settings, scripts: AsyncScripts) -> None:
        self.settings = settings
        self.scripts = scripts

    async def take(self, identity: str) -> None:
        """ApiError 429 rate_limited, with Retry-After, when `identity` is over its rate."""
        verdict = parse_gateway_rate(await self.scripts(gateway_rate_call(self.settings, identity)))
        if not verdict.allowed:
            wait_s = max(1, math.ceil(verdict.retry_after_ms / 1000))
            limit = self.settings.gateway_rate_limit
            raise ApiError(429, "rate_limited", f"over the rate limit of {limit:g} requests a "
                           f"second (burst {burst_of(self.settings)}); retry in {wait_s}s",
                           headers={"Retry-After": str(wait_s)})


class Auth:
    def __init__(self, mode: AuthMode, cache: KeyCache, rate: RateLimit | None = None) -> None:
        self.mode = mode
        self.cache = cache
        self.rate = rate

    async def check(self, token: str | None, needed: Role, peer: str | None = None) -> KeyRecord | None:
        """The caller's key (None when no key is needed); ApiError 401/403 otherwise, and 429
        over the rate limit (per key; per client address `peer` for a call without one).
        `token`: the key the request carries (bearer_token), if any."""
        record = await self._authenticate(token, needed)
        if self.rate is not None:
            await self.rate.take(f"key:{record.id}" if record is not None else f"addr:{peer or '-'}")
        return record

    async def _authenticate(self, token: str | None, needed: Role) -> KeyRecord | None:
        if self.mode is AuthMode.OFF:
            return None
        if token is None:
            if self.mode is AuthMode.AUTO and not await self.cache.keys():
                return None
            raise ApiError(401, "unauthorized", "this gateway needs an API key: "
                           "send 'Authorization: Bearer <key>' (make one with `reach keys create`)",
                           headers={"WWW-Authenticate": "Bearer"})
        record = await self.cache.find(token)
        if record is None:
            raise ApiError(401, "unauthorized", "unknown or revoked API key",
                           headers={"WWW-Authenticate": "Bearer"})
        if not record.role.allows(needed):
            raise ApiError(403, "forbidden", f"a {record.role.value} key cannot do this "
                           f"(it needs a {needed.value} key)")
        return record


def bearer_token(authorization: str | None) -> str | None:
    """The key of an Authorization header, as HTTPBearer reads it (for the routes that read
    their request themselves: gateway/hot.py, the protocols' guard)."""
    scheme, _, token = (authorization or "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def require(role: Role) -> Callable[..., Awaitable[KeyRecord | None]]:
    """A dependency: the request's key must have `role` (or one that includes it)."""

    async def dependency(request: Request, credentials: Credentials) -> KeyRecord | None:
        auth: Auth = request.app.state.gateway.auth
        return await auth.check(credentials.credentials if credentials is not None else None, role,
                                request.client.host if request.client else None)

    return dependency
