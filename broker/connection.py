"""Redis connections: single node or Cluster, TLS and ACL from the URL.

`redis://[user:password@]host:port/db`, `rediss://` for TLS (certificate options as query
parameters, e.g. `?ssl_cert_reqs=required&ssl_ca_certs=/path/ca.pem`), `unix:///path.sock`,
and `redis+cluster://` / `rediss+cluster://` (or REACH_CLUSTER=true) for Redis Cluster, where any
node's address is enough. Connections are short on timeouts so that a missing Redis shows up as
BrokerUnavailable quickly, and long-running processes reconnect with backoff (see `retrying`).

On Cluster the client follows MOVED/ASK itself and, on a lost node, re-reads the slot map and
retries a few times; what is left over (a failover that takes longer than that) surfaces as one
of TRANSIENT_ERRORS, like a single Redis that went away. A cluster that cannot be reached at all
(no seed node answers, slots not covered yet) is reported as a ConnectionError too, not as
redis-py's generic RedisClusterException, so that it is retried the same way.

Pub/sub on Cluster: PUBLISH (also from inside a script) reaches every node, masters and
replicas, so a subscriber may listen on any one node. `open_pubsub` picks one the client knows,
and a subscriber whose node dies opens a new pubsub on another (see broker/listener.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio
from redis.asyncio.cluster import ClusterPipeline as AsyncClusterPipeline
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.backoff import ExponentialWithJitterBackoff
from redis.cluster import RedisCluster
from redis.maint_notifications import MaintNotificationsConfig
from redis.retry import Retry
from redis.sentinel import Sentinel
from tenacity import (
    AsyncRetrying,
    Retrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential,
    wait_random,
)

from broker.errors import BrokerUnavailable, ConfigError

try:
    import hiredis
except ImportError:  # (a dependency through redis[hiredis]; without it, redis-py's own packer)
    hiredis = None  # type: ignore[assignment]
from broker.settings import Settings, redact_url

log = logging.getLogger("reach.connection")

SyncClient = redis.Redis | RedisCluster
AsyncClient = redis.asyncio.Redis | AsyncRedisCluster

# Errors that mean "Redis is not reachable right now" (as opposed to a bad command).
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ClusterDownError,  # also MasterDownError
    redis.exceptions.TryAgainError,
    redis.exceptions.SlotNotCoveredError,  # a slot whose master died, before its failover
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


class _HiredisPacking:
    """Packs commands with hiredis (C) rather than redis-py's pure-Python asyncio packer: the
    same bytes for a fraction of the CPU (a dispatcher packs one HMGET per ready task). Anything
    hiredis refuses (a lone surrogate that must round-trip, a wrong type) goes the usual way,
    with the usual errors."""

    def pack_command(self, *args: Any) -> list[bytes]:
        head = args[0]
        if isinstance(head, str):
            parts: tuple[Any, ...] = (*head.encode().split(), *args[1:])
        elif b" " in head:
            parts = (*head.split(), *args[1:])
        else:
            parts = args
        try:
            return [hiredis.pack_command(parts)]
        except (TypeError, UnicodeEncodeError):
            return super().pack_command(*args)  # type: ignore[misc, no-any-return]


class _FastConnection(_HiredisPacking, redis.asyncio.Connection):
    pass


class _FastSSLConnection(_HiredisPacking, redis.asyncio.SSLConnection):
    pass


class _FastSyncConnection(_HiredisPacking, redis.Connection):
    pass


class _FastSyncSSLConnection(_HiredisPacking, redis.SSLConnection):
    pass


def _standalone_options(url: str, asynchronous: bool) -> dict[str, Any]:
    """The options of a plain (not Cluster, not Sentinel) client for `url`."""
    options = {**_COMMON, **_fast_connection_class(url, asynchronous)}
    if url.startswith("unix://"):
        del options["socket_keepalive"]  # (a TCP option: a Unix socket connection refuses it)
    # redis-py 8 enables its maintenance notifications (a Redis Enterprise feature) on "auto",
    # and while they are on, its pool hands out a pooled connection the server has closed
    # without replacing it, so the first exchange after a Redis restart fails.
    options["maint_notifications_config"] = MaintNotificationsConfig(enabled=False)
    return options


def _fast_connection_class(url: str, asynchronous: bool = True) -> dict[str, Any]:
    if hiredis is None:
        return {}
    if url.startswith("redis://"):
        return {"connection_class": _FastConnection if asynchronous else _FastSyncConnection}
    if url.startswith("rediss://"):
        return {"connection_class": _FastSSLConnection if asynchronous else _FastSyncSSLConnection}
    return {}


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
    if url.startswith(("redis+sentinel://", "rediss+sentinel://")):
        parse_sentinel_url(url)  # (checked here, used by the client factories)
        return url, False
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise ConfigError(f"unsupported Redis URL {redact_url(url)!r}: use redis://, rediss://, "
                          "unix://, redis+cluster:// or redis+sentinel://")
    return url, cluster


@dataclass(frozen=True)
class SentinelTarget:
    sentinels: list[tuple[str, int]]
    service: str
    db: int
    username: str | None
    password: str | None
    ssl: bool


def parse_sentinel_url(url: str) -> SentinelTarget:
    """`redis+sentinel://[user:password@]host:port[,host:port...]/service[/db]` (the password is
    the data nodes'; sentinels are asked without one unless REACH_SENTINEL_PASSWORD is set)."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    path = [p for p in parts.path.split("/") if p]
    try:
        sentinels = [(h.rsplit(":", 1)[0], int(h.rsplit(":", 1)[1]) if ":" in h else 26379)
                     for h in netloc.split(",") if h]
        db = int(path[1]) if len(path) > 1 else 0
    except ValueError:
        sentinels, db = [], 0
    if not sentinels or not path:
        raise ConfigError(f"invalid Sentinel URL {redact_url(url)!r}: use "
                          "redis+sentinel://host:26379[,host:26379]/service_name[/db]")
    return SentinelTarget(sentinels, path[0], db, unquote(parts.username) if parts.username else None,
                          unquote(parts.password) if parts.password else None,
                          url.startswith("rediss+"))


def _sentinel_master(target: SentinelTarget, asynchronous: bool, socket_timeout: float | None) -> Any:
    sentinel_auth = {"password": os.environ["REACH_SENTINEL_PASSWORD"]} \
        if os.environ.get("REACH_SENTINEL_PASSWORD") else {}
    options = {k: v for k, v in _COMMON.items() if k != "health_check_interval"}
    sentinel_cls = AsyncSentinel if asynchronous else Sentinel
    sentinel = sentinel_cls(target.sentinels, socket_timeout=socket_timeout,
                            socket_connect_timeout=3, sentinel_kwargs=sentinel_auth)
    return sentinel.master_for(target.service, db=target.db, username=target.username,
                               password=target.password, ssl=target.ssl,
                               socket_timeout=socket_timeout, **options)



def _cluster_options() -> dict[str, Any]:
    return {
        **_COMMON,
        # redis-py's own retries of one command on a lost node (it re-reads the slot map in
        # between); longer outages are ours to ride out (`retrying`, `with_reconnect`).
        "retry": Retry(ExponentialWithJitterBackoff(base=0.05, cap=1.0), retries=10),
    }


def _unreachable(exc: redis.exceptions.RedisClusterException) -> bool:
    """Whether redis-py's catch-all cluster error means "cannot reach the cluster right now"."""
    if isinstance(exc, redis.exceptions.SlotNotCoveredError):
        return True
    text = str(exc)
    return text.startswith(("Redis Cluster cannot be connected", "All slots are not covered"))




_CONNECTION_CODE = (
    os.path.join("redis", "asyncio", "connection.py"),
    os.path.join("redis", "connection.py"),
)
_PARSER_CODE = os.path.join("redis", "_parsers", "")


def _closed_under_us(exc: AttributeError) -> bool:
    """An AttributeError raised inside redis-py's connection code: a topology refresh that failed
    (cluster down, a node dead) closes every node's connections, also ones another coroutine or
    thread is using at that moment, whose reader/writer then is None (redis-py 8.1, asyncio:
    `'NoneType' object has no attribute 'writelines'` in Connection._send_packed_command)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return False
    filename = tb.tb_frame.f_code.co_filename
    return filename.endswith(_CONNECTION_CODE) or _PARSER_CODE in filename


def _as_connection_error(exc: AttributeError) -> redis.exceptions.ConnectionError:
    return redis.exceptions.ConnectionError(f"connection closed while in use ({exc})")


class _SyncCluster(RedisCluster):
    """RedisCluster that reports an unreachable cluster (and a connection closed under a
    command by a concurrent topology refresh) as a ConnectionError."""

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().execute_command(*args, **kwargs)  # type: ignore[no-untyped-call]
        except redis.exceptions.RedisClusterException as exc:
            if _unreachable(exc):
                raise redis.exceptions.ConnectionError(str(exc)) from exc
            raise
        except AttributeError as exc:
            if _closed_under_us(exc):
                raise _as_connection_error(exc) from exc
            raise


class _AsyncClusterPipeline(AsyncClusterPipeline):
    async def execute(self, *args: Any, **kwargs: Any) -> list[Any]:
        try:
            return await super().execute(*args, **kwargs)
        except AttributeError as exc:
            if _closed_under_us(exc):
                raise _as_connection_error(exc) from exc
            raise


class _AsyncCluster(AsyncRedisCluster):
    """asyncio RedisCluster whose failures while the cluster is unreachable or reconfiguring are
    all ConnectionErrors (so every reconnect loop retries them): redis-py's catch-all
    RedisClusterException when no node answers, and the AttributeError of a connection closed
    under a command by a concurrent topology refresh."""

    async def initialize(self, *args: Any, **kwargs: Any) -> _AsyncCluster:
        try:
            await super().initialize(*args, **kwargs)
        except redis.exceptions.RedisClusterException as exc:
            if _unreachable(exc):
                raise redis.exceptions.ConnectionError(str(exc)) from exc
            raise
        return self

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().execute_command(*args, **kwargs)
        except AttributeError as exc:
            if _closed_under_us(exc):
                raise _as_connection_error(exc) from exc
            raise

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> _AsyncClusterPipeline:
        if shard_hint:
            raise redis.exceptions.RedisClusterException("shard_hint is deprecated in cluster mode")
        return _AsyncClusterPipeline(self, transaction)  # type: ignore[abstract]


def sync_client(settings: Settings, *, socket_timeout: float | None = 10) -> SyncClient:
    """A client for short commands. On Cluster it connects at once (to learn the slot map):
    BrokerUnavailable if no node answers. With Sentinel it follows the current master."""
    url, cluster = resolve_url(settings)
    if url.startswith(("redis+sentinel://", "rediss+sentinel://")):
        return _sentinel_master(parse_sentinel_url(url), False, socket_timeout)  # type: ignore[no-any-return]
    if cluster:
        try:
            return _SyncCluster.from_url(url, socket_timeout=socket_timeout, **_cluster_options())
        except redis.exceptions.RedisClusterException as exc:
            if _unreachable(exc):
                raise unavailable(exc, settings) from exc
            raise
        except TRANSIENT_ERRORS as exc:
            raise unavailable(exc, settings) from exc
    return redis.Redis.from_url(url, socket_timeout=socket_timeout,
                                **_standalone_options(url, asynchronous=False))


def async_client(settings: Settings, *, socket_timeout: float | None = 10) -> AsyncClient:
    """An asyncio client; on Cluster it learns the slot map at its first command."""
    url, cluster = resolve_url(settings)
    if url.startswith(("redis+sentinel://", "rediss+sentinel://")):
        return _sentinel_master(parse_sentinel_url(url), True, socket_timeout)  # type: ignore[no-any-return]
    if cluster:
        return _AsyncCluster.from_url(url, socket_timeout=socket_timeout, **_cluster_options())
    return redis.asyncio.Redis.from_url(url, socket_timeout=socket_timeout,
                                        **_standalone_options(url, asynchronous=True))


def is_cluster(client: Any) -> bool:
    return isinstance(client, RedisCluster | AsyncRedisCluster)


def _candidates(client: Any, avoid: Collection[str]) -> list[Any]:
    """The cluster's known nodes in random order, the ones in `avoid` last."""
    nodes = list(client.get_nodes())
    random.shuffle(nodes)
    return sorted(nodes, key=lambda node: node.name in avoid)


_PING_TIMEOUT_S = 1.0
_PING_ERRORS: tuple[type[BaseException], ...] = (*TRANSIENT_ERRORS, TimeoutError)


def open_pubsub(client: Any, *, avoid: Collection[str] = ()) -> Any:
    """A PubSub (for a synchronous client) that ignores subscribe confirmations.

    On Cluster it is bound to one node that answers a PING, master or replica, chosen at random
    with the node names in `avoid` (e.g. the one that just failed) tried last: every node gets
    every PUBLISH, and a random choice spreads many subscribers over the cluster. Its node is
    `pubsub_node_name(pubsub)`. A ConnectionError when no node answers. Without a cluster it is
    the client's own pubsub.
    """
    if not is_cluster(client):
        return client.pubsub(ignore_subscribe_messages=True)
    error: BaseException | None = None
    for node in _candidates(client, avoid):
        try:
            client.get_redis_connection(node).ping()
        except TRANSIENT_ERRORS as exc:
            error = exc
            continue
        return client.pubsub(node=node, ignore_subscribe_messages=True)
    raise redis.exceptions.ConnectionError(f"no cluster node answers for pub/sub: {error}")


async def open_async_pubsub(client: Any, *, avoid: Collection[str] = ()) -> Any:
    """`open_pubsub` for an asyncio client (on Cluster it first learns the nodes if it has not
    yet, and raises one of TRANSIENT_ERRORS when none answers)."""
    if not isinstance(client, AsyncRedisCluster):
        return client.pubsub(ignore_subscribe_messages=True)
    await client.initialize()
    error: BaseException | None = None
    for node in _candidates(client, avoid):
        try:
            await asyncio.wait_for(node.execute_command("PING"), _PING_TIMEOUT_S)
        except _PING_ERRORS as exc:
            error = exc
            continue
        return client.pubsub(node=node, ignore_subscribe_messages=True)
    raise redis.exceptions.ConnectionError(f"no cluster node answers for pub/sub: {error}")


def pubsub_node_name(pubsub: Any) -> str | None:
    """The "host:port" a cluster pubsub is bound to (None without a cluster)."""
    node = getattr(pubsub, "node", None)
    return str(node.name) if node is not None else None


WAIT_OUTAGE_S = 15.0
"""How long a wait (result, events) rides out Redis being unreachable before it gives up."""


class WaitOutage:
    """Backoff for a wait while Redis is unreachable; BrokerUnavailable when it lasts too long."""

    def __init__(self, settings: Settings, deadline: float | None) -> None:
        self.settings = settings
        self.deadline = deadline
        self.since: float | None = None
        self.pause = 0.05

    def over(self) -> None:
        self.since = None
        self.pause = 0.05

    def next_pause(self, exc: BaseException) -> float:
        now = time.monotonic()
        self.since = self.since or now
        if now - self.since > WAIT_OUTAGE_S or (self.deadline is not None and now > self.deadline):
            raise unavailable(exc, self.settings) from exc
        pause, self.pause = self.pause, min(self.pause * 2, 1.0)
        return pause


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
    try:  # the common case, without building a retry state machine for every call
        return await op()
    except TRANSIENT_ERRORS as exc:
        log.warning("Redis unavailable (%s); retrying", exc)
    async for attempt in async_retrying():
        with attempt:
            return await op()
    raise AssertionError("unreachable")


def warn_if_evicting(client: Any) -> str | None:
    """Warn when Redis may evict keys (tasks would vanish silently). Returns the warning, if any.

    On Cluster every master is asked: one evicting shard loses that shard's tasks."""
    try:
        if is_cluster(client):
            replies = client.config_get("maxmemory-policy", target_nodes=client.PRIMARIES)
            policies = {str(node): reply.get("maxmemory-policy") for node, reply in replies.items()}
        else:
            policies = {"": client.config_get("maxmemory-policy").get("maxmemory-policy")}
    except redis.exceptions.RedisError:
        return None  # CONFIG may be disabled (managed Redis, ACL); nothing to check then
    evicting = {node: policy for node, policy in policies.items()
                if policy and policy != "noeviction"}
    if not evicting:
        return None
    where = ", ".join(f"{policy!r} on {node}" if node else repr(policy)
                      for node, policy in sorted(evicting.items()))
    msg = (
        f"Redis maxmemory-policy is {where}: under memory pressure Redis may evict task "
        "keys and tasks would vanish. Set maxmemory-policy noeviction."
    )
    log.warning(msg)
    return msg


def check_eviction(settings: Settings) -> str | None:
    """`warn_if_evicting` with a short-lived client of its own (for process start-up); None
    also when Redis cannot be reached yet (the process reconnects and carries on)."""
    try:
        client = sync_client(settings)
    except (BrokerUnavailable, ConnectionError):
        return None
    try:
        return warn_if_evicting(client)
    except TRANSIENT_ERRORS:
        return None
    finally:
        client.close()
