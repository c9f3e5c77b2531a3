"""Following a task's events for a Server-Sent Events stream, from any point in its history.

Each stream reads the task's record (watch.lua: its events after the last one sent, and the
flag that makes the scripts publish its new ones) and then waits on the task's channel, which
it subscribes on the gateway's one pub/sub connection (a TaskListener shared by every stream):
a thousand streams cost a thousand subscriptions, not a thousand connections. Pub/sub only
wakes a stream; the record stays the truth, so nothing is lost or sent twice across a
reconnect: a client that comes back with Last-Event-ID gets exactly what followed it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from broker.client.events import TERMINAL_STATES, event_ends_story
from broker.client.listener import TaskListener
from broker.errors import UnknownTask
from broker.infra import outages
from broker.keys import Channels
from broker.models import TaskEvent
from broker.protocol import lifecycle
from broker.scripts import AsyncScripts
from broker.settings import Settings

RECHECK_S = 5.0
"""With no message for this long a stream reads the record again (a message lost to a
reconnect of the pub/sub connection costs at most this long)."""
READ_MAX = 1000
"""Most events watch.lua returns at once."""


async def follow(settings: Settings, scripts: AsyncScripts, listener: TaskListener, task_id: str,
                 after: int = 0, reads: asyncio.Semaphore | None = None) -> AsyncIterator[TaskEvent]:
    """The task's events after seq `after`, then live ones, until its terminal event (or its
    record expires). UnknownTask before the first event when no such task exists. `reads` bounds
    the record reads in flight at once (a thousand streams woken together must not open a
    thousand Redis connections)."""
    reads = reads or asyncio.Semaphore(1)
    channel = Channels(settings.prefix).task(task_id)
    outage = outages.WaitOutage(settings, None)
    queue = await listener.watch(channel)
    last, ended, seen = after, False, False
    try:
        while True:
            try:
                async with reads:
                    reply = await scripts(lifecycle.watch_call(settings, task_id, "events", "w", last))
                state, _, fresh = lifecycle.parse_events(reply)
                outage.over()
            except outages.TRANSIENT_ERRORS as exc:
                await asyncio.sleep(outage.next_pause(exc))
                continue
            if state is None:
                if not seen:
                    raise UnknownTask(task_id)
                return
            seen = True
            for event in fresh:
                last = event.seq
                ended = event_ends_story(event, ended)
                yield event
            if state in TERMINAL_STATES and (ended or not fresh):
                return  # (not fresh: resumed after the end, nothing more will come)
            if len(fresh) == READ_MAX:
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(queue.get(), RECHECK_S)
            while not queue.empty():
                queue.get_nowait()  # (one read covers the burst)
    finally:
        await listener.unwatch(channel, queue)
