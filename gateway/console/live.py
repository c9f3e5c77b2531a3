"""Live updates for every open console page, from one reader per gateway.

While at least one page listens, the hub reads the fleet once every TICK_S (fleet_snapshot:
queues and agents) and whatever came into the capability event feeds and the registry's event
stream since (FeedReader), renders what changed once, and pushes it to every page over
Server-Sent Events (`GET /console/live`):

    event: overview   the Overview table's rows (HTML)
    event: agents     the Agents table's rows (HTML), with a summary of states
    event: feed       one line of the activity feed (HTML) per task or agent event

So ten open tabs cost what one does, an agent that goes suspect or offline shows within a
tick or two, and no page polls Redis. The fragments are rendered from the same autoescaped
templates as the pages. With nobody listening for IDLE_S, the hub stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from broker.infra.outages import TRANSIENT_ERRORS
from broker.ops.feed import FeedReader
from broker.scripts import Scripts
from gateway.console.data import Activity, FleetSnapshot, activity, fleet_snapshot
from gateway.console.render import render
from gateway.state import GatewayState

log = logging.getLogger("reach.gateway")

TICK_S = 1.0
ACTIVITY_EVERY_S = 30.0
IDLE_S = 10.0
FEED_KEPT = 50
"""Feed lines a page that opens gets at once (the recent past)."""
QUEUE_MAX = 500
"""Messages waiting for one slow page; beyond, it misses some (the next snapshot heals it)."""

Message = tuple[str, str]


class LiveHub:
    def __init__(self, gw: GatewayState) -> None:
        self.gw = gw
        self.listeners: set[asyncio.Queue[Message]] = set()
        self.latest: dict[str, str] = {}
        self.feed: deque[str] = deque(maxlen=FEED_KEPT)
        self.snapshot: FleetSnapshot | None = None
        self.activity: dict[str, Activity] = {}
        self._activity_at = 0.0
        self._reader = FeedReader(gw.settings)
        self._task: asyncio.Task[None] | None = None
        self._scripts: Scripts | None = None

    async def listen(self) -> AsyncIterator[Message]:
        """The current state, then every change, for as long as the caller iterates."""
        queue: asyncio.Queue[Message] = asyncio.Queue(QUEUE_MAX)
        self.listeners.add(queue)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="console-live")
        try:
            for name, html in list(self.latest.items()):
                yield name, html
            for line in list(self.feed):
                yield "feed", line
            while True:
                yield await queue.get()
        finally:
            self.listeners.discard(queue)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def _run(self) -> None:
        idle_since: float | None = None
        while True:
            if self.listeners:
                idle_since = None
            elif idle_since is None:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > IDLE_S:
                return
            try:
                await self.tick()
            except TRANSIENT_ERRORS as exc:
                log.warning("console live view: cannot read Redis (%s)", exc)
            except Exception:
                log.exception("console live view: a tick failed")
            await asyncio.sleep(TICK_S)

    async def tick(self) -> None:
        settings = self.gw.settings
        snapshot = await self.gw.in_thread(lambda r: fleet_snapshot(r, settings))
        names = [q.capability for q in snapshot.queues]
        events = await self.gw.in_thread(lambda r: self._reader.read(r, names))
        if time.monotonic() - self._activity_at >= ACTIVITY_EVERY_S or set(names) - set(self.activity):
            self._activity_at = time.monotonic()

            def read_activity(r: Any) -> dict[str, Activity]:
                self._scripts = self._scripts or Scripts(r)
                return activity(r, self._scripts, settings, names, snapshot.now_ms)

            self.activity = await self.gw.in_thread(read_activity)
        self.snapshot = snapshot
        self._publish("overview", render("_overview_rows.html", snapshot=snapshot, activity=self.activity))
        self._publish("agents", render("_agent_rows.html", snapshot=snapshot))
        for event in events:
            line = render("_feed_item.html", event=event)
            self.feed.append(line)
            self._send(("feed", line))

    def _publish(self, name: str, html: str) -> None:
        if self.latest.get(name) == html:
            return
        self.latest[name] = html
        self._send((name, html))

    def _send(self, message: Message) -> None:
        for queue in list(self.listeners):
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(message)

