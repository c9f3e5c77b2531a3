"""The Lua scripts of `broker/lua/`, loaded once per client and called by name.

Each script's text is assembled by broker/script_source.py; `broker/protocol/` builds each call's
keys and arguments and parses its reply. These runners send them the cheapest way there is.
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import redis
from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.client import Redis
from redis.cluster import RedisCluster

from broker.protocol.calls import ScriptCall
from broker.script_source import LIBRARY, READ_ONLY_SCRIPTS, SCRIPT_NAMES, prelude, source

__all__ = ["LIBRARY", "SCRIPT_NAMES", "AsyncScripts", "Lane", "Scripts", "evalsha_command", "prelude",
           "source"]


def evalsha_command(sha: str, call: ScriptCall, verb: str = "EVALSHA") -> tuple[Any, ...]:
    """The bare EVALSHA of a call. (redis-py's Script wraps one in several layers, which cost
    more than the round trip on a hot path, and asks Redis whether the script exists first.)"""
    return (verb, sha, len(call.keys), *call.keys, *call.args)


def _no_read_only_eval(exc: redis.exceptions.ResponseError) -> bool:
    """Whether Redis does not know EVALSHA_RO (before 7.0)."""
    return "unknown command" in str(exc).lower()


class Scripts:
    """Runs ScriptCalls on a synchronous client (EVALSHA, loading the script when Redis lacks it)."""

    def __init__(self, client: Redis | RedisCluster) -> None:
        self._client: Any = client
        self._cluster = isinstance(client, RedisCluster)
        self._scripts = {name: client.register_script(source(name)) for name in SCRIPT_NAMES}
        self._kept = threading.local()
        # Threads keep at most half of the pool's connections: the rest stay for calls that
        # take one per call (redis-py 8 lends at most 100 by default, and refuses beyond).
        pool = getattr(client, "connection_pool", None)
        self._kept_quota = _KeptQuota(int(getattr(pool, "max_connections", 0) or 0) // 2)
        self._read_only: bool | None = None
        """Whether Redis runs EVALSHA_RO (None: not known yet)."""

    def _evalsha_ro(self, script: Any, call: ScriptCall) -> Any:
        """A read-only script the way a user with read-only keys may run it (broker/acl.py);
        loaded first when Redis lacks it."""
        command = evalsha_command(script.sha, call, "EVALSHA_RO")
        try:
            return self._client.execute_command(*command)
        except redis.exceptions.NoScriptError:
            self._client.script_load(script.script)
            return self._client.execute_command(*command)

    def __call__(self, call: ScriptCall, client: Any = None) -> Any:
        script = self._scripts[call.name]
        if client is None and call.name in READ_ONLY_SCRIPTS and self._read_only is not False:
            try:
                return self._evalsha_ro(script, call)
            except redis.exceptions.ResponseError as exc:
                if not _no_read_only_eval(exc):
                    raise
                self._read_only = False  # (Redis 6.2: EVALSHA below)
        if client is None:
            # A bare EVALSHA: redis-py's Script wraps it in several layers, which cost more
            # than the round trip on a hot path.
            try:
                return self._evalsha(script.sha, call)
            except redis.exceptions.NoScriptError:
                pass  # (the Script below loads it)
        return script(keys=call.keys, args=call.args, client=client)

    def _evalsha(self, sha: str, call: ScriptCall) -> Any:
        """EVALSHA straight on the connection this thread keeps (see _kept_connection). redis-py's
        execute_command wraps each command in a retry loop and observability hooks, about a
        third of the CPU a producer's submit costs. A connection that fails half way is
        closed, never reused with a reply unread. A lost connection (one a proxy or a failover
        dropped while it sat idle) gets one more try on a fresh one, as redis-py's own retry
        gave it; callers that ride out longer outages do so themselves (ReachClient._write).
        (Not a timeout: the call may still be running.)"""
        return self.command(*evalsha_command(sha, call))

    def command(self, *args: Any) -> Any:
        """One plain command sent the lean way of _evalsha (a lost connection gets one more
        try). For the producer's wait on a task's done list, which every round trip makes:
        redis-py's own path costs it more CPU than the rest of result(). (A retried BLMOVE of a
        list onto itself changes nothing.)"""
        if self._cluster:
            return self._client.execute_command(*args)
        try:
            return self._exchange(args)
        except redis.exceptions.ConnectionError:
            return self._exchange(args)

    def _exchange(self, args: tuple[Any, ...]) -> Any:
        kept = self._kept_connection()
        # (A pooled one when this thread keeps none, or when its own is in the middle of an
        # exchange: a signal handler that calls the client while the thread waits in result().)
        own = kept if kept is not None and not kept.busy else None
        conn = own.conn if own is not None else self._client.connection_pool.get_connection()
        if own is not None:
            own.busy = True
        try:
            if not conn.is_connected:
                # (connect() itself: a Sentinel connection asks the sentinels for the master
                # there; the connecting that sending does by itself goes to the last address.)
                conn.connect()
            conn.send_packed_command(conn.pack_command(*args))
            return conn.read_response()
        except redis.exceptions.ResponseError:
            raise  # (an error reply: the connection is in step)
        except BaseException:
            conn.disconnect()  # (it connects again when next used)
            raise
        finally:
            if own is not None:
                own.busy = False
            else:
                self._client.connection_pool.release(conn)

    def _kept_connection(self) -> _Kept | None:
        """The connection this thread keeps for its exchanges. Taking one from the pool and
        giving it back around every exchange cost a producer about a fifth of its CPU per
        round trip (the pool's lock, its health check's poll, redis-py 8's observability
        hooks): in paired runs 365-370 us against 300-305 us kept. It goes back to the pool
        when the thread ends; a process forked with one takes its own (a connection is never
        shared by two processes). One the server dropped fails its exchange and connects
        again (command() gives the call one more try, as it did with pooled ones). None once
        threads keep half of the pool's connections: the others' calls take one per call."""
        kept: _Kept | None = getattr(self._kept, "kept", None)
        if kept is not None and kept.pid == os.getpid():
            return kept
        quota = self._kept_quota
        if not quota.take():
            return None
        try:
            kept = self._kept.kept = _Kept(self._client.connection_pool, quota.give_back)
        except BaseException:
            quota.give_back()
            raise
        return kept


class _KeptQuota:
    """How many connections threads keep from one pool, at most `most`. Apart from Scripts
    because the finalizer of every kept connection holds its give_back: were that a method of
    Scripts, the finalizers would keep the Scripts, its client and its pool alive until every
    thread that used it ended (a dropped client's connections open for the life of the main
    thread), instead of the client's end dropping its thread-local and with it the _Kepts."""

    __slots__ = ("_count", "_lock", "_most")

    def __init__(self, most: int) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._most = most

    def take(self) -> bool:
        with self._lock:
            if self._count >= self._most:
                return False
            self._count += 1
            return True

    def give_back(self) -> None:
        with self._lock:
            self._count -= 1


class _Kept:
    """A pooled connection that one thread keeps (Scripts._kept_connection): its thread's
    local storage holds this, so it is given back to the pool once the thread ends."""

    __slots__ = ("__weakref__", "busy", "conn", "pid")

    def __init__(self, pool: Any, given_back: Callable[[], None]) -> None:
        self.conn = pool.get_connection()
        self.pid = os.getpid()
        self.busy = False
        weakref.finalize(self, _give_back, pool, self.conn, given_back)


def _give_back(pool: Any, conn: Any, given_back: Callable[[], None]) -> None:
    pool.release(conn)
    given_back()


class AsyncScripts:
    """Runs ScriptCalls on an asyncio client."""

    def __init__(self, client: AsyncRedis | AsyncRedisCluster) -> None:
        self._client = client
        self._cluster = isinstance(client, AsyncRedisCluster)
        self._scripts = {name: client.register_script(source(name)) for name in SCRIPT_NAMES}
        self._read_only: bool | None = None
        """Whether Redis runs EVALSHA_RO (None: not known yet; see Scripts._evalsha_ro)."""

    @property
    def pool(self) -> Any:
        client: Any = self._client  # (a cluster client has none: it never takes this path)
        return client.connection_pool

    async def __call__(self, call: ScriptCall, client: Any = None) -> Any:
        script = self._scripts[call.name]
        if client is None and call.name in READ_ONLY_SCRIPTS and self._read_only is not False:
            try:
                return await self._evalsha_ro(script, call)
            except redis.exceptions.ResponseError as exc:
                if not _no_read_only_eval(exc):
                    raise
                self._read_only = False
        if client is None:
            try:
                return await self._client.execute_command(*evalsha_command(script.sha, call))
            except redis.exceptions.NoScriptError:
                pass  # (the Script below loads it)
        return await script(keys=call.keys, args=call.args, client=client)

    async def _evalsha_ro(self, script: Any, call: ScriptCall) -> Any:
        command = evalsha_command(script.sha, call, "EVALSHA_RO")
        try:
            return await self._client.execute_command(*command)
        except redis.exceptions.NoScriptError:
            await self._client.script_load(script.script)
            return await self._client.execute_command(*command)

    def lane(self) -> Lane:
        """A connection of its own for one long-lived loop's exchanges (see Lane)."""
        return Lane(self)

    async def run_all(self, calls: list[ScriptCall], extra: Sequence[tuple[Any, ...]] = (),
                      lane: Lane | None = None) -> list[Any]:
        """Run several calls in one round trip, in order, each atomic on its own (not all
        together), then the plain commands in `extra` (their replies follow the calls'; an
        error of theirs is returned, not raised: the calls' effects stand). A call whose script
        Redis lacks is run again alone, which loads it. On Cluster, whose pipelines refuse
        EVALSHA, the calls go one by one (and `extra` is not allowed). `lane`: the caller's own
        connection, instead of one from the pool."""
        if self._cluster:
            if extra:
                raise ValueError("extra commands need a pipeline, which Cluster does not offer here")
            return [await self(call) for call in calls]
        # Bare EVALSHAs: a reply is a NoScriptError if Redis lacks the script (then the call
        # runs again alone, which loads it). redis-py's own way would ask Redis whether the
        # scripts exist before every execute, one more round trip.
        commands = [evalsha_command(self._scripts[call.name].sha, call) for call in calls]
        commands += extra
        if not commands:
            return []
        replies = await self._pipelined(commands, lane)
        out = []
        for i, reply in enumerate(replies):
            if i < len(calls) and isinstance(reply, redis.exceptions.NoScriptError):
                reply = await self(calls[i])
            elif i < len(calls) and isinstance(reply, Exception):
                raise reply
            out.append(reply)
        return out

    async def command(self, *args: Any, lane: Lane | None = None) -> Any:
        """One plain command, sent the lean way (see _pipelined); its error is raised. For a
        worker's blocking inbox read, which every task at low load waits on."""
        if self._cluster:
            return await self._client.execute_command(*args)
        (reply,) = await self._pipelined([args], lane)
        if isinstance(reply, Exception):
            raise reply
        return reply

    async def _pipelined(self, commands: list[tuple[Any, ...]], lane: Lane | None = None) -> list[Any]:
        """Send the commands in one write and read their replies, an error reply as its
        exception. redis-py's Pipeline does the same with several layers around it (a command
        stack, observability hooks, a retry loop, a reset) that cost a worker more CPU than
        the round trip itself, once per report. The whole exchange gets the client's socket
        timeout once, instead of one timer for the write and one for each reply (each costs
        a task or a timer handle). A connection that fails, times out or is abandoned half
        way is closed, never reused with replies left unread; the caller retries
        (connection.with_reconnect)."""
        client: Any = self._client
        pool = client.connection_pool
        if lane is not None and not lane.busy:
            return await lane.exchange(commands)
        conn = await pool.get_connection()
        try:
            return await self._exchange(conn, commands)
        finally:
            await pool.release(conn)

    async def _exchange(self, conn: Any, commands: list[tuple[Any, ...]]) -> list[Any]:
        """_pipelined on a connection taken already (a disconnected one connects again)."""
        client: Any = self._client
        limit = conn.socket_timeout
        conn.socket_timeout = None  # (restored below; the connection is ours until released)
        try:
            async with asyncio.timeout(limit):
                await conn.send_packed_command(conn.pack_commands(commands))
                replies: list[Any] = []
                for command in commands:
                    try:
                        reply = await conn.read_response()
                    except redis.exceptions.ResponseError as exc:
                        replies.append(exc)
                        continue
                    callback = client.response_callbacks.get(command[0])
                    replies.append(callback(reply) if callback is not None else reply)
                return replies
        except BaseException as exc:
            await conn.disconnect(nowait=True)
            if isinstance(exc, TimeoutError) and not isinstance(exc, redis.exceptions.RedisError):
                raise redis.exceptions.TimeoutError(
                    f"no reply from Redis within {limit}s") from None
            raise
        finally:
            conn.socket_timeout = limit


class Lane:
    """A connection that one long-lived loop keeps for its exchanges (a worker's inbox reader
    has one, its reporter another), instead of taking one from the pool and giving it back
    for every exchange: the pool's lock and its observability hooks are about forty calls of
    Python per exchange, and a round trip at low load is two exchanges of the worker's (in
    paired runs its CPU per round trip fell from 495-520 to 430-460 us). One exchange at a
    time: a lane belongs to one loop (an exchange that finds it busy takes a pooled one).

    Like the pool, a lane looks at its connection before each use: one the server closed
    while the lane sat idle (a restart, a proxy's idle timeout), or that holds a stray reply,
    is connected again first. A connection whose exchange failed, timed out or was abandoned
    half way is closed (see AsyncScripts._exchange) and given back; the next exchange takes
    a fresh one. (So after a Sentinel failover a lane, like a pooled connection in use, moves
    to the new master once the old one refuses it: a demoted master answers READONLY, which
    redis-py's Sentinel connection turns into a connection error.)"""

    def __init__(self, scripts: AsyncScripts) -> None:
        self._scripts = scripts
        self._conn: Any = None
        self.busy = False

    async def command(self, *args: Any) -> Any:
        return await self._scripts.command(*args, lane=self)

    async def run_all(self, calls: list[ScriptCall], extra: Sequence[tuple[Any, ...]] = ()) -> list[Any]:
        return await self._scripts.run_all(calls, extra, lane=self)

    async def exchange(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        """AsyncScripts._pipelined on this lane's connection."""
        self.busy = True
        try:
            conn = self._conn
            if conn is None:
                conn = self._conn = await self._scripts.pool.get_connection()
            elif not conn.is_connected or await _stale(conn):
                # (connect() itself, as the pool does: a Sentinel connection asks the sentinels
                # for the master there; the connecting that sending does goes to the last address.)
                await conn.disconnect()
                await conn.connect()
            try:
                return await self._scripts._exchange(conn, commands)
            except BaseException:
                await self.close()  # (closed by _exchange already: a fresh one next time)
                raise
        finally:
            self.busy = False

    async def close(self) -> None:
        """Give the connection back to the pool (the lane takes another when used again)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            await self._scripts.pool.release(conn)


async def _stale(conn: Any) -> bool:
    """Whether a kept connection must be connected again before use: the server closed it, or
    something unread sits in it (redis-py's pool asks the same before it hands one out)."""
    try:
        return bool(await conn.can_read())
    except (redis.exceptions.ConnectionError, OSError):
        return True
