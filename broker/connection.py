"""Redis connections: single node or Cluster, TLS and ACL from the URL.

`redis://[user:password@]host:port/db`, `rediss://` for TLS (certificate options as query
parameters, e.g. `?ssl_cert_reqs=required&ssl_ca_certs=/path/ca.pem`), `unix:///path.sock`,
and `redis+cluster://` / `rediss+cluster://` (or REACH_CLUSTER=true) for Redis Cluster, where any
node's address is enough. Connections are short on timeouts so that a missing Redis shows up as
BrokerUnavailable quickly, and long-running processes reconnect with backoff (see `retrying`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis
import redis.asyncio
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from tenacity import (
    AsyncRetrying,
    Retrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential,
    wait_random,
)

from broker.errors import BrokerUnavailable, ConfigError
from broker.settings import Settings, redact_url

log = logging.getLogger("reach.connection")

SyncClient = redis.Redis | RedisCluster
AsyncClient = redis.asyncio.Redis | AsyncRedisCluster

# Errors that mean "Redis is not reachable right now" (as opposed to a bad command).
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
    redis.exceptions.BusyLoadingError,
    ConnectionError,
)
# (Not OSError: the builtin TimeoutError is one, and a wait that times out is not Redis's fault.)

T = TypeVar("T")

_COMMON: dict[str, Any] = {
    "decode_responses": True,
    # Bytes that are not UTF-8 (a stranger's stream entry) must not crash a reader: they decode
    # to lone surrogates, which validation then refuses as malformed.
    "encoding_errors": "surrogateescape",
    "socket_connect_timeout": 3,
    "socket_keepalive": True,
    "health_check_interval": 15,
}


def resolve_url(settings: Settings) -> tuple[str, bool]:
    """(url for redis-py, cluster?) from the settings."""
    url = settings.redis_url
    if not url:
        raise ConfigError("no Redis URL: set REDIS_URL or pass --redis-url")
    cluster = settings.cluster
    for scheme in ("redis+cluster://", "rediss+cluster://"):
        if url.startswith(scheme):
            url = url.replace("+cluster", "", 1)
            cluster = True
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise ConfigError(f"unsupported Redis URL {redact_url(url)!r}: use redis://, rediss:// or unix://")
    return url, cluster


def sync_client(settings: Settings, *, socket_timeout: float | None = 10) -> SyncClient:
    url, cluster = resolve_url(settings)
    if cluster:
        return RedisCluster.from_url(url, decode_responses=True, socket_timeout=socket_timeout,
                                     socket_connect_timeout=3, encoding_errors="surrogateescape")
    return redis.Redis.from_url(url, socket_timeout=socket_timeout, **_COMMON)


def async_client(settings: Settings, *, socket_timeout: float | None = 10) -> AsyncClient:
    url, cluster = resolve_url(settings)
    if cluster:
        return AsyncRedisCluster.from_url(url, decode_responses=True, socket_timeout=socket_timeout,
                                          socket_connect_timeout=3,
                                          encoding_errors="surrogateescape")
    return redis.asyncio.Redis.from_url(url, socket_timeout=socket_timeout, **_COMMON)


def pubsub_node_client(settings: Settings) -> redis.asyncio.Redis:
    """A plain connection for pub/sub. On Cluster, PUBLISH reaches every node, so one node is enough."""
    url, _ = resolve_url(settings)
    return redis.asyncio.Redis.from_url(url, socket_timeout=None, **_COMMON)


def unavailable(exc: BaseException, settings: Settings) -> BrokerUnavailable:
    return BrokerUnavailable(f"Redis at {settings.redacted_url()} is unavailable: {exc}")


def retrying(settings: Settings, give_up_after_s: float = 5.0) -> Retrying:
    """Retry a short operation on transient Redis errors with jittered exponential backoff."""
    return Retrying(
        retry=retry_if_exception_type(TRANSIENT_ERRORS),
        wait=wait_exponential(multiplier=0.05, max=1.0) + wait_random(0, 0.05),
        stop=stop_after_delay(give_up_after_s),
        reraise=True,
    )


def async_retrying(give_up_after_s: float | None = None) -> AsyncRetrying:
    """Like `retrying`, for long-running loops: by default it never gives up."""
    stop = stop_after_delay(give_up_after_s) if give_up_after_s is not None else None
    kwargs: dict[str, Any] = {"stop": stop} if stop else {}
    return AsyncRetrying(
        retry=retry_if_exception_type(TRANSIENT_ERRORS),
        wait=wait_exponential(multiplier=0.1, max=5.0) + wait_random(0, 0.1),
        reraise=True,
        before_sleep=_log_retry,
        **kwargs,
    )


def _log_retry(state: Any) -> None:
    exc = state.outcome.exception() if state.outcome else None
    log.warning("Redis unavailable (%s); retrying in %.1fs", exc, state.next_action.sleep)


async def with_reconnect(op: Callable[[], Awaitable[T]]) -> T:
    """Run `op` until it succeeds, backing off while Redis is away."""
    async for attempt in async_retrying():
        with attempt:
            return await op()
    raise AssertionError("unreachable")


def warn_if_evicting(client: redis.Redis) -> str | None:
    """Warn when Redis may evict keys (tasks would vanish silently). Returns the warning, if any."""
    try:
        policy = client.config_get("maxmemory-policy").get("maxmemory-policy")
    except redis.exceptions.RedisError:
        return None  # CONFIG may be disabled (managed Redis, ACL); nothing to check then
    if policy and policy != "noeviction":
        msg = (
            f"Redis maxmemory-policy is {policy!r}: under memory pressure Redis may evict task "
            "keys and tasks would vanish. Set maxmemory-policy noeviction."
        )
        log.warning(msg)
        return msg
    return None
