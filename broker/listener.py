"""One pub/sub connection shared by every wait of an asyncio client.

Waiting for thousands of tasks at once must not take thousands of connections: each wait
subscribes its task's channel on this one connection and gets the messages in a queue. A `None`
in the queue means "the connection was lost, messages may be missing: read the record again".
Pub/sub only wakes waiters; the task's record and event list stay the truth.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from broker.connection import TRANSIENT_ERRORS

log = logging.getLogger("reach.listener")


class TaskListener:
    def __init__(self, client: Any) -> None:
        self._client = client
        self._pubsub: Any = None
        self._queues: dict[str, set[asyncio.Queue[str | None]]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    async def watch(self, channel: str) -> asyncio.Queue[str | None]:
        """Subscribe (if needed) and return a queue that receives the channel's messages."""
        queue: asyncio.Queue[str | None] = asyncio.Queue()
        async with self._lock:
            if self._pubsub is None:
                self._pubsub = self._client.pubsub(ignore_subscribe_messages=True)
            first = channel not in self._queues
            self._queues.setdefault(channel, set()).add(queue)
            if first:
                try:
                    await self._pubsub.subscribe(channel)
                except BaseException:
                    self._drop(channel, queue)
                    raise
            if self._reader is None or self._reader.done():
                self._reader = asyncio.create_task(self._read(), name="reach-task-listener")
        return queue

    async def unwatch(self, channel: str, queue: asyncio.Queue[str | None]) -> None:
        async with self._lock:
            if self._drop(channel, queue) and self._pubsub is not None:
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
        if self._pubsub is not None:
            with contextlib.suppress(*TRANSIENT_ERRORS):
                await self._pubsub.aclose()
        self._pubsub = None

    async def _read(self) -> None:
        backoff = 0.05
        while self._queues:
            try:
                message = await self._pubsub.get_message(timeout=1.0)
                backoff = 0.05
            except TRANSIENT_ERRORS as exc:
                log.warning("pub/sub connection lost (%s); waiters re-read their tasks", exc)
                self._broadcast(None)
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
