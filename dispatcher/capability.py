"""One capability's share of the dispatcher: intake, due retries, routing.

Each step does whatever is ready and reports whether it moved anything; with nothing to do the
loop sleeps until a wake-up (new task, freed capacity, registry change) or the next due retry,
never longer than the idle tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

import redis

from broker import connection, protocol
from broker.errors import BadInput, QueueFull
from broker.keys import DISPATCH_GROUP, CapabilityKeys
from dispatcher import routing
from dispatcher.intake import parse_intake_entry

if TYPE_CHECKING:
    from dispatcher.service import Dispatcher

log = logging.getLogger("reach.dispatcher")

INTAKE_BATCH = 200
PROMOTE_BATCH = 200
INTAKE_CLAIM_IDLE_MS = 60_000


class CapabilityLoop:
    def __init__(self, dispatcher: Dispatcher, capability: str) -> None:
        self.d = dispatcher
        self.capability = capability
        self.keys = CapabilityKeys(dispatcher.settings.prefix, capability)
        self.loads: dict[str, routing.InboxLoad] = {}
        self._wake = asyncio.Event()
        self._next_due_ms: float | None = None
        self._intake_group_ready = False
        self._intake_pending_checked = False
        self.dispatched = 0

    def kick(self) -> None:
        self._wake.set()

    def note_load(self, agent_id: str, outstanding: int, running: int) -> None:
        self.loads[agent_id] = routing.InboxLoad(outstanding, running)

    async def run(self) -> None:
        backoff = 0.1
        while True:
            self._wake.clear()
            try:
                progressed = await self.step()
                backoff = 0.1
            except connection.TRANSIENT_ERRORS as exc:
                log.warning("%s: Redis unavailable (%s); retrying in %.1fs", self.capability, exc,
                            backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            if progressed:
                await asyncio.sleep(0)  # let other capabilities and the wake listener run
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._idle_timeout())

    def _idle_timeout(self) -> float:
        tick = self.d.settings.idle_tick_ms / 1000
        if self._next_due_ms is None:
            return tick
        until_due = (self._next_due_ms - self.d.view.now_ms()) / 1000
        return max(0.001, min(tick, until_due))

    async def step(self) -> bool:
        moved = await self._intake()
        moved += await self._promote()
        moved += await self._route()
        return moved > 0

    # -- intake -----------------------------------------------------------------------------

    async def _intake(self) -> int:
        r = self.d.redis
        stream = self.keys.intake
        if not self._intake_group_ready:
            try:
                await r.xgroup_create(stream, DISPATCH_GROUP, id="0", mkstream=True)
            except redis.exceptions.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
            self._intake_group_ready = True
        # First our own unfinished entries (a QueueFull earlier, or a restart), then new ones.
        start = ">" if self._intake_pending_checked else "0"
        reply = await r.xreadgroup(DISPATCH_GROUP, self.d.dispatcher_id, {stream: start},
                                   count=INTAKE_BATCH)
        entries = reply[0][1] if reply else []
        if start == "0" and len(entries) < INTAKE_BATCH:
            self._intake_pending_checked = True
        if not entries and start == ">":
            entries = await self._claim_abandoned_intake()
        if not entries:
            return 0
        requests = []
        for entry_id, fields in entries:
            if fields is None:  # deleted while pending
                await r.xack(stream, DISPATCH_GROUP, entry_id)
                continue
            try:
                requests.append(parse_intake_entry(self.d.settings, self.capability, entry_id, fields))
            except BadInput as exc:
                log.warning("%s: malformed intake entry %s: %s", self.capability, entry_id, exc)
                await self.d.scripts(protocol.dead_letter_raw_call(
                    self.d.settings, self.capability, stream, DISPATCH_GROUP, entry_id,
                    "malformed", str(exc), fields))
        if requests:
            try:
                protocol.parse_submit(self.capability, self.d.settings.max_queue_depth,
                                      await self.d.scripts(protocol.submit_call(self.d.settings, requests)))
            except QueueFull as exc:
                log.warning("%s: %s; intake entries wait", self.capability, exc)
                self._intake_pending_checked = False
                return 0
        return len(entries)

    async def _claim_abandoned_intake(self) -> list[Any]:
        """Entries another dispatcher read and never finished (it died): take them over."""
        reply = await self.d.redis.xautoclaim(
            self.keys.intake, DISPATCH_GROUP, self.d.dispatcher_id, INTAKE_CLAIM_IDLE_MS,
            start_id="0-0", count=INTAKE_BATCH)
        entries: list[Any] = reply[1] if reply else []
        return [e for e in entries if e]

    # -- retries that are due ---------------------------------------------------------------

    async def _promote(self) -> int:
        now = self.d.view.now_ms()
        if self._next_due_ms is not None and now < self._next_due_ms:
            return 0
        r = self.d.redis
        due = await r.zrangebyscore(self.keys.delayed, "-inf", now, start=0, num=PROMOTE_BATCH)
        moved = 0
        if due:
            moved = int(await self.d.scripts(protocol.promote_call(self.d.settings, self.capability, due)))
        head = await r.zrange(self.keys.delayed, 0, 0, withscores=True)
        self._next_due_ms = float(head[0][1]) if head else None
        return moved

    # -- routing ----------------------------------------------------------------------------

    def candidates(self) -> list[routing.Candidate]:
        out = []
        for record in self.d.view.ready_for(self.capability):
            p50 = record.stats.get("latency_p50_ms")
            out.append(routing.Candidate(
                agent_id=record.agent_id,
                max_concurrency=record.max_concurrency,
                load=self.loads.setdefault(record.agent_id, routing.InboxLoad()),
                latency_p50_ms=float(p50) if isinstance(p50, int | float) else None,
            ))
        return out

    async def refresh_loads(self, agent_ids: list[str]) -> None:
        """Read exact inbox loads (length and pending count) for these agents."""
        if not agent_ids:
            return
        pipe = self.d.redis.pipeline(transaction=False)
        for agent_id in agent_ids:
            pipe.xlen(self.keys.inbox(agent_id))
            pipe.xpending(self.keys.inbox(agent_id), "agents")
        replies = await pipe.execute(raise_on_error=False)
        for i, agent_id in enumerate(agent_ids):
            length, pending = replies[2 * i], replies[2 * i + 1]
            running = pending.get("pending", 0) if isinstance(pending, dict) else 0
            self.note_load(agent_id, int(length) if isinstance(length, int) else 0, int(running))

    async def _route(self) -> int:
        settings = self.d.settings
        candidates = self.candidates()
        rooms = {c.agent_id: routing.room(c, settings) for c in candidates}
        want = min(sum(rooms.values()), settings.dispatch_batch)
        if want <= 0:
            return 0
        r = self.d.redis
        ids = await r.zrange(self.keys.queue, 0, want - 1)
        if not ids:
            return 0
        tasks = [routing.ReadyTask(local_id, 5, "", "") for local_id in ids]
        plan = routing.assign(tasks, candidates, settings)
        by_id = {c.agent_id: c for c in candidates}
        progressed = 0
        for agent_id, local_ids in plan.items():
            call = protocol.dispatch_call(settings, self.capability, agent_id,
                                          routing.max_unread(by_id[agent_id], settings), local_ids)
            result = protocol.parse_dispatch(await self.d.scripts(call))
            self.note_load(agent_id, result.inbox_len, result.inbox_pending)
            self.dispatched += result.dispatched
            progressed += result.dispatched + result.expired + result.taken
        return progressed
