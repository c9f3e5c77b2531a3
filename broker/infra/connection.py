"""Redis connections: single node, Cluster or Sentinel, TLS and ACL from the URL.

`redis://[user:password@]host:port/db`, `rediss://` for TLS (the server's certificate is
verified, its host name too; the CA and a client certificate come from the settings
tls_ca_file, tls_cert_file, tls_key_file, or the URL's query parameters, which win:
`?ssl_ca_certs=/path/ca.pem&ssl_certfile=...&ssl_keyfile=...`), `unix:///path.sock`,
`redis+cluster://` / `rediss+cluster://` (or REACH_CLUSTER=true) for Redis Cluster, where any
node's address is enough, and `redis+sentinel://` for a master found through Sentinel.
Connections are short on timeouts so that a missing Redis shows up as BrokerUnavailable
quickly; how callers ride out an outage is broker/infra/outages.py, and Cluster's quirks are
broker/infra/cluster.py.

Pub/sub on Cluster: PUBLISH (also from inside a script) reaches every node, masters and
replicas, so a subscriber may listen on any one node. `open_pubsub` picks one the client knows,
and a subscriber whose node dies opens a new pubsub on another (see broker/client/listener.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.cluster import RedisCluster
from redis.maint_notifications import MaintNotificationsConfig
from redis.sentinel import Sentinel

from broker.errors import BrokerUnavailable, ConfigError
from broker.infra.cluster import AsyncCluster, SyncCluster, cluster_options, unreachable
from broker.infra.outages import TRANSIENT_ERRORS, unavailable
from broker.settings import Settings, redact_url

try:
    import hiredis
except ImportError:  # (a dependency through redis[hiredis]; without it, redis-py's own packer)
    hiredis = None  # type: ignore[assignment]

log = logging.getLogger("reach.connection")

SyncRedis = redis.Redis | RedisCluster
"""A synchronous client as connection.sync_client makes it."""
AsyncRedis = redis.asyncio.Redis | AsyncRedisCluster
"""An asyncio client as connection.async_client makes it."""

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


class _FastUnixConnection(_HiredisPacking, redis.asyncio.UnixDomainSocketConnection):
    pass


class _FastSyncUnixConnection(_HiredisPacking, redis.UnixDomainSocketConnection):
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
    if url.startswith("unix://"):
        return {"connection_class": _FastUnixConnection if asynchronous else _FastSyncUnixConnection}
    return {}


def tls_options(settings: Settings, url: str) -> dict[str, Any]:
    """The tls_* settings as redis-py options (the URL's own parameters override them); a
    ConfigError when they are set for a URL without TLS (they would be ignored silently)."""
    options = settings.tls_options()
    if options and not url.startswith(("rediss://", "rediss+")):
        raise ConfigError("tls_ca_file, tls_cert_file and tls_key_file need a rediss:// URL "
                          f"(the Redis URL is {redact_url(url)!r})")
    return options


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


def _sentinel_master(target: SentinelTarget, asynchronous: bool, socket_timeout: float | None,
                     settings: Settings, named: dict[str, str]) -> Any:
    sentinel_auth = {"password": os.environ["REACH_SENTINEL_PASSWORD"]} \
        if os.environ.get("REACH_SENTINEL_PASSWORD") else {}
    options = {k: v for k, v in _COMMON.items() if k != "health_check_interval"}
    tls: dict[str, Any] = dict(settings.tls_options()) if target.ssl else {}
    sentinel_cls = AsyncSentinel if asynchronous else Sentinel
    sentinel = sentinel_cls(target.sentinels, socket_timeout=socket_timeout,
                            socket_connect_timeout=3, sentinel_kwargs=sentinel_auth)
    return sentinel.master_for(target.service, db=target.db, username=target.username,
                               password=target.password, ssl=target.ssl,
                               socket_timeout=socket_timeout, **{**options, **tls, **named})


def _named(client_name: str | None) -> dict[str, str]:
    """redis-py's option that names each connection (CLIENT SETNAME as it connects)."""
    return {"client_name": client_name} if client_name else {}


def sync_client(settings: Settings, *, socket_timeout: float | None = 10,
                client_name: str | None = None) -> SyncRedis:
    """A client for short commands. On Cluster it connects at once (to learn the slot map):
    BrokerUnavailable if no node answers. With Sentinel it follows the current master.
    `client_name`: the name its connections carry in CLIENT LIST (on every node of a Cluster)."""
    url, cluster = resolve_url(settings)
    if url.startswith(("redis+sentinel://", "rediss+sentinel://")):
        return _sentinel_master(parse_sentinel_url(url), False, socket_timeout, settings,  # type: ignore[no-any-return]
                                _named(client_name))
    if cluster:
        try:
            return SyncCluster.from_url(url, socket_timeout=socket_timeout, **cluster_options(_COMMON),
                                        **tls_options(settings, url), **_named(client_name))
        except redis.exceptions.RedisClusterException as exc:
            if unreachable(exc):
                raise unavailable(exc, settings) from exc
            raise
        except TRANSIENT_ERRORS as exc:
            raise unavailable(exc, settings) from exc
    return redis.Redis.from_url(url, socket_timeout=socket_timeout,
                                **_standalone_options(url, asynchronous=False),
                                **tls_options(settings, url), **_named(client_name))


def async_client(settings: Settings, *, socket_timeout: float | None = 10,
                 max_connections: int | None = None, client_name: str | None = None) -> AsyncRedis:
    """An asyncio client; on Cluster it learns the slot map at its first command.

    `max_connections` (a single node): at most that many connections, a command beyond them
    waiting up to socket_timeout for one; for a server whose bursts of requests would otherwise
    open a connection each (more than Redis accepts at once). `client_name`: as sync_client's."""
    url, cluster = resolve_url(settings)
    if url.startswith(("redis+sentinel://", "rediss+sentinel://")):
        return _sentinel_master(parse_sentinel_url(url), True, socket_timeout, settings,  # type: ignore[no-any-return]
                                _named(client_name))
    if cluster:
        return AsyncCluster.from_url(url, socket_timeout=socket_timeout, **cluster_options(_COMMON),
                                     **tls_options(settings, url), **_named(client_name))
    options = {**_standalone_options(url, asynchronous=True), **tls_options(settings, url),
               **_named(client_name)}
    if max_connections is None:
        return redis.asyncio.Redis.from_url(url, socket_timeout=socket_timeout, **options)
    pool = redis.asyncio.BlockingConnectionPool.from_url(
        url, socket_timeout=socket_timeout, max_connections=max_connections, timeout=socket_timeout,
        **options)
    return redis.asyncio.Redis.from_pool(pool)


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
