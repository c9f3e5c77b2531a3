"""Waiting for a task's outcome over HTTP (GET /v1/tasks/{id}/result?wait=N).

A long-poll subscribes the task's channel on the gateway's one pub/sub connection (a write,
not a round trip), then reads the outcome (watch.lua, which also makes the scripts publish the
task's outcome as it ends): a task that ended is answered at once, one that has not with the
outcome its end published (one more read when that is too large to ride along, or after a
reconnect). Reading before subscribing, then again after it to close the gap, took three reads
for a long-poll sent right after its submit. Unsubscribing never delays the answer. `wait=0`
only reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Any

from broker import codec
from broker.client.events import message_is_terminal
from broker.client.listener import TaskListener
from broker.errors import UnknownTask
from broker.keys import Channels
from broker.protocol import lifecycle
from broker.scripts import AsyncScripts
from broker.settings import Settings

RECHECK_S = 5.0
"""A wait reads the outcome again this often even with no message (one lost to a reconnect)."""


@dataclass(frozen=True, slots=True)
class Outcome:
    state: str
    result: Any = None
    reason: str | None = None
    error: str | None = None

    @property
    def ended(self) -> bool:
        return self.state in ("succeeded", "failed", "canceled")

    def as_dict(self, task_id: str) -> dict[str, Any]:
        out: dict[str, Any] = {"task_id": task_id, "state": self.state}
        if self.state == "succeeded":
            out["result"] = self.result
        elif self.state in ("failed", "canceled"):
            out["reason"] = self.reason or ("canceled" if self.state == "canceled" else "failure")
            out["error"] = self.error
        return out


class ResultWaits:
    def __init__(self, settings: Settings, scripts: AsyncScripts, listener: TaskListener) -> None:
        self.settings = settings
        self.scripts = scripts
        self.listener = listener
        self._unwatching: set[asyncio.Task[None]] = set()
        self._lane = scripts.lane()
        """A kept connection for the reads (see broker/scripts.py's Lane; busy: a pooled one)."""

    async def close(self) -> None:
        await self._lane.close()

    async def read(self, task_id: str) -> Outcome:
        (reply,) = await self.scripts.run_all([lifecycle.watch_call(self.settings, task_id, "outcome", "w")],
                                              lane=self._lane)
        if not lifecycle.task_exists(reply):
            raise UnknownTask(task_id)
        state, result, reason, error = reply[:4]
        return Outcome(state, codec.loads(result) if state == "succeeded" and result else None,
                       reason or None, error or None)

    async def wait(self, task_id: str, wait_s: float) -> Outcome:
        """The outcome once the task ended, or its state after `wait_s` seconds."""
        if wait_s <= 0:
            return await self.read(task_id)
        deadline = time.monotonic() + wait_s
        channel = Channels(self.settings.prefix).task(task_id)
        queue = await self.listener.watch(channel)
        try:
            while True:
                outcome = await self.read(task_id)
                remaining = deadline - time.monotonic()
                if outcome.ended or remaining <= 0:
                    return outcome
                with contextlib.suppress(TimeoutError):
                    while True:  # (until a terminal event, or a reconnect: None)
                        message = await asyncio.wait_for(queue.get(), min(remaining, RECHECK_S))
                        pushed = lifecycle.message_outcome(message) if message else None
                        if pushed is not None:
                            return Outcome(*pushed)  # (as the task ended: no read needed)
                        if message is None or message_is_terminal(message):
                            break
        finally:
            task = asyncio.create_task(self.listener.unwatch(channel, queue))  # (not awaited)
            self._unwatching.add(task)
            task.add_done_callback(self._unwatching.discard)
