"""Redis Cluster as Reach needs it: failures while the cluster is unreachable or reconfiguring
surface as ConnectionErrors (so every reconnect loop retries them), not as redis-py's catch-all
RedisClusterException or the AttributeError of a connection closed under a command by a
concurrent topology refresh."""

from __future__ import annotations

import os
from typing import Any

import redis
from redis.asyncio.cluster import ClusterPipeline as AsyncClusterPipeline
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.backoff import ExponentialWithJitterBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry


def cluster_options(common: dict[str, Any]) -> dict[str, Any]:
    return {
        **common,
        # redis-py's own retries of one command on a lost node (it re-reads the slot map in
        # between); longer outages are ours to ride out (broker/infra/outages.py).
        "retry": Retry(ExponentialWithJitterBackoff(base=0.05, cap=1.0), retries=10),
    }


def unreachable(exc: redis.exceptions.RedisClusterException) -> bool:
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


class SyncCluster(RedisCluster):
    """RedisCluster that reports an unreachable cluster (and a connection closed under a
    command by a concurrent topology refresh) as a ConnectionError."""

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().execute_command(*args, **kwargs)  # type: ignore[no-untyped-call]
        except redis.exceptions.RedisClusterException as exc:
            if unreachable(exc):
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


class AsyncCluster(AsyncRedisCluster):
    """asyncio RedisCluster whose failures while the cluster is unreachable or reconfiguring are
    all ConnectionErrors (so every reconnect loop retries them): redis-py's catch-all
    RedisClusterException when no node answers, and the AttributeError of a connection closed
    under a command by a concurrent topology refresh."""

    async def initialize(self, *args: Any, **kwargs: Any) -> AsyncCluster:
        try:
            await super().initialize(*args, **kwargs)
        except redis.exceptions.RedisClusterException as exc:
            if unreachable(exc):
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
