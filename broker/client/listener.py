"""One pub/sub connection shared by every wait of an asyncio client.

Waiting for thousands of tasks at once must not take thousands of connections: each wait
subscribes its task's channel on this one connection and gets the messages in a queue. A `None`
in the queue means "the connection was lost, messages may be missing: read the record again".
Pub/sub only wakes waiters; the task's record and event list stay the truth.

When the connection is lost the reader opens a new one and subscribes every watched channel
again. On Redis Cluster the new one goes to another node (`connection.open_async_pubsub`): every
node gets every PUBLISH, so a waiter is not tied to a node that died or was failed over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from broker.infra import connection
from broker.infra.outages import TRANSIENT_ERRORS

log = logging.getLogger("reach.listener")

_CLOSE_TIMEOUT_S = 2.0


class TaskListener:
    def __init__(self, client: connection.AsyncRedis) -> None:
        self._client = client
        self._pubsub: Any = None
        self._stale = False  # the pubsub failed: open a new one before using it again
        self._queues: dict[str, set[asyncio.Queue[str | None]]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    async def watch(self, channel: str) -> asyncio.Queue[str | None]:
        """Subscribe (if needed) and return a queue that receives the channel's messages.

        Never fails on a lost connection: the reader subscribes the channel as soon as a node
        answers, and then puts a None in the queue (read the record again)."""
        queue: asyncio.Queue[str | None] = asyncio.Queue()
        async with self._lock:
            first = channel not in self._queues
            self._queues.setdefault(channel, set()).add(queue)
            if first and not self._stale:
                try:
                    if self._pubsub is None:
                        self._pubsub = await connection.open_async_pubsub(self._client)
                    await self._pubsub.subscribe(channel)
                except TRANSIENT_ERRORS as exc:
                    log.warning("pub/sub subscribe failed (%s); reconnecting", exc)
                    self._stale = True
                except BaseException:
                    self._drop(channel, queue)
                    raise
            if self._reader is None or self._reader.done():
                self._reader = asyncio.create_task(self._read(), name="reach-task-listener")
        return queue

    async def unwatch(self, channel: str, queue: asyncio.Queue[str | None]) -> None:
        async with self._lock:
            if self._drop(channel, queue) and self._pubsub is not None and not self._stale:
                with contextlib.suppress(*TRANSIENT_ERRORS):
                    await self._pubsub.unsubscribe(channel)

    def _drop(self, channel: str, queue: asyncio.Queue[str | None]) -> bool:
        """Forget a queue; True when it was the channel's last one."""
        queues = self._queues.get(channel)
        if queues is None:
            return False
        queues.discard(queue)
        if queues:
            return False
        del self._queues[channel]
        return True

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, *TRANSIENT_ERRORS):
                await self._reader
        await self._close_pubsub(self._pubsub)
        self._pubsub = None

    @staticmethod
    async def _close_pubsub(pubsub: Any) -> None:
        if pubsub is not None:
            with contextlib.suppress(*TRANSIENT_ERRORS, TimeoutError):
                await asyncio.wait_for(pubsub.aclose(), _CLOSE_TIMEOUT_S)

    async def _reopen(self) -> None:
        """Replace a failed pubsub by a new one (another node on Cluster) with every channel."""
        async with self._lock:
            old = self._pubsub
            failed = connection.pubsub_node_name(old) if old is not None else None
            self._pubsub = None
            await self._close_pubsub(old)
            pubsub = await connection.open_async_pubsub(
                self._client, avoid=[failed] if failed else ())
            try:
                if self._queues:
                    await pubsub.subscribe(*self._queues)
            except BaseException:
                await self._close_pubsub(pubsub)
                raise
            self._pubsub = pubsub
            self._stale = False
            where = connection.pubsub_node_name(pubsub)
            log.info("pub/sub reconnected%s; %d channel(s) subscribed again",
                     f" on {where}" if where else "", len(self._queues))
        self._broadcast(None)  # messages may have been missed while no connection listened

    async def _read(self) -> None:
        backoff = 0.05
        while self._queues:
            try:
                if self._stale or self._pubsub is None:
                    await self._reopen()
                message = await self._pubsub.get_message(timeout=1.0)
                backoff = 0.05
            except TRANSIENT_ERRORS as exc:
                # Waiters are told (None) once a new connection listens, not now: reading their
                # records while Redis (or a failing-over shard) is away would only fail.
                if not self._stale:
                    log.warning("pub/sub connection lost (%s); reconnecting", exc)
                    self._stale = True
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            if message and message.get("type") == "message":
                for queue in self._queues.get(message["channel"], ()):
                    queue.put_nowait(message["data"])

    def _broadcast(self, item: str | None) -> None:
        for queues in self._queues.values():
            for queue in queues:
                queue.put_nowait(item)
