"""Following a task's events from a synchronous client: what it has, then what comes, live.

The record is the truth; the task's pub/sub channel only says when to look again, so nothing
is missed between the read and the subscribe.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from broker.client.events import TERMINAL_STATES, event_ends_story
from broker.errors import UnknownTask
from broker.infra import connection, outages
from broker.infra.connection import SyncRedis
from broker.models import TaskEvent
from broker.protocol import lifecycle
from broker.scripts import Scripts
from broker.settings import Settings

BLOCK_CHUNK_S = 5.0
"""Longest single blocking call; a wait longer than this is several such calls (the socket must
not time out under a blocked command). Not polling: each call blocks until woken."""


def close_quietly(pubsub: Any) -> None:
    """Close a pubsub that is being abandoned, ignoring errors."""
    if pubsub is not None:
        with contextlib.suppress(Exception):
            pubsub.close()


def follow_events(settings: Settings, redis_client: SyncRedis, scripts: Scripts, channel: str,
                  task_id: str, timeout: float | None,
                  errors: Callable[[], AbstractContextManager[None]]) -> Iterator[TaskEvent]:
    """Every event of the task from the first, then new ones live, until the terminal one
    (ReachClient.events); `errors` maps library errors as the client does."""
    deadline = None if timeout is None else time.monotonic() + timeout
    outage = outages.WaitOutage(settings, deadline)
    pubsub: Any = None
    last = 0
    ended = False
    seen = False
    try:
        while True:
            try:
                if pubsub is None:
                    pubsub = connection.open_pubsub(redis_client)
                    pubsub.subscribe(channel)
                # The record is the truth; the channel only says when to look again.
                state, _, fresh = lifecycle.parse_events(scripts(
                    lifecycle.watch_call(settings, task_id, "events", "w", last)))
                outage.over()
            except outages.TRANSIENT_ERRORS as exc:
                close_quietly(pubsub)
                pubsub = None
                time.sleep(outage.next_pause(exc))
                continue
            if state is None:
                if not seen:
                    with errors():
                        raise UnknownTask(task_id)
                return  # the record expired under us: nothing more will come
            seen = True
            for event in fresh:
                last = event.seq
                ended = event_ends_story(event, ended)
                yield event
            if fresh and ended and state in TERMINAL_STATES:
                return  # the last lifecycle event is terminal (and no replay followed)
            if fresh and len(fresh) == 1000:
                continue  # more to read at once
            remaining = BLOCK_CHUNK_S if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"task {task_id} has not finished after {timeout}s; it keeps running")
            try:
                pubsub.get_message(timeout=min(remaining, BLOCK_CHUNK_S))
                while pubsub.get_message(timeout=0) is not None:
                    pass  # drain a burst: one read covers it
            except outages.TRANSIENT_ERRORS:
                close_quietly(pubsub)
                pubsub = None  # reopened (maybe elsewhere) on the next turn
    finally:
        close_quietly(pubsub)
