"""Reading a worker's inboxes: for each capability, a loop that blocks on XREADGROUP for as many
entries as it has free slots and starts each task at once from what its entry carries.

At start, and after every lost connection, a reader first looks at the entries already
delivered to this agent id ("recover"): a reply lost in a Redis restart, or an earlier process
of the same id. An entry that carries less than a start needs, that this agent id held before
this process, or whose deadline has passed is accepted first (accept.lua checks it). Only the
delivery a task expects is ever unread in an inbox (a reclaim, release or cancel takes its
entry out in the same step), so a fresh entry's start is recorded afterwards (reporter.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import redis

from agent_worker.attempt import Running
from agent_worker.binding import Binding
from agent_worker.session import AgentSession
from agent_worker.slots import Slots
from broker.infra import fatal, outages
from broker.infra.connection import AsyncRedis
from broker.keys import AGENT_GROUP, CapabilityKeys
from broker.protocol.delivery import AcceptedTask, Lease, accept_call, parse_accept, parse_entry, parse_lease
from broker.protocol.lifecycle import dead_letter_raw_call
from broker.scripts import AsyncScripts, Lane
from broker.settings import Settings

log = logging.getLogger("reach.worker")

READ_BLOCK_MS = 1000
Entries = list[tuple[str, dict[str, str]]]
Start = Callable[[Binding, AcceptedTask, bool], None]


class Inboxes:
    def __init__(self, settings: Settings, session: AgentSession, redis_client: AsyncRedis,
                 scripts: AsyncScripts, bindings: dict[str, Binding], slots: Slots,
                 running: Running, recover: set[str], start: Start) -> None:
        self.settings = settings
        self.session = session
        self.redis = redis_client
        self.scripts = scripts
        self.bindings = bindings
        self.slots = slots
        self.running = running
        self.recover = recover
        """Capabilities whose inbox may hold entries delivered to this agent id that no one
        runs (at start, and after a lost connection): the reader looks there first."""
        self._start = start
        self._share = max(1, slots.concurrency // len(bindings))

    async def reader(self, binding: Binding) -> None:
        """Read one capability's inbox until the worker stops."""
        await self.session.registered.wait()
        lane = self.scripts.lane()  # (a connection of its own for the blocking reads)
        try:
            await self._read(binding, lane)
        finally:
            await lane.close()

    async def _read(self, binding: Binding, lane: Lane) -> None:
        backoff = 0.1
        inbox = self._inbox(binding.capability)
        while not self.slots.closed:
            held = await self.slots.reserve(self._share)  # (released exactly once)
            if held == 0:
                return
            try:
                recover = binding.capability in self.recover
                entries = await self._read_once(binding, lane, held, recover)
                self.slots.release(held - len(entries))
                held = 0  # (from here on, every slot is a started task's or released by begin)
                if entries and self.slots.paused and not recover:
                    # Read as the worker paused (its HTTP agent is not ready): started once it
                    # is ready, as entries delivered before (or handed on when their lease lapses).
                    self.slots.release(len(entries))
                    self.recover.add(binding.capability)
                    continue
                if entries:
                    await self.begin(binding, entries, fresh=not recover)
                    # Let the tasks just started run, and the report of those that end at once
                    # go out, before the next (blocking) read is sent: that read can wait a
                    # moment, a producer waiting for a result cannot.
                    await asyncio.sleep(0)
                    await asyncio.sleep(0)
                backoff = 0.1
            except outages.TRANSIENT_ERRORS as exc:  # (before ResponseError: CLUSTERDOWN is one)
                self.slots.release(held)
                self.recover.add(binding.capability)
                log.warning("reading inbox %s failed (%s); retrying in %.1fs", inbox, exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
            except redis.exceptions.ResponseError as exc:
                self.slots.release(held)
                self.recover.add(binding.capability)
                if fatal.stops(exc):
                    return
                if "NOGROUP" in str(exc):  # the inbox was deleted under us: make it again
                    await self.session.rebind(binding.capability)
                    continue
                # Anything else is unexpected: say so loudly, but never stop reading.
                log.exception("reading inbox %s failed; retrying in %.1fs", inbox, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    async def _read_once(self, binding: Binding, lane: Lane, most: int, recover: bool) -> Entries:
        """Up to `most` entries: those delivered to this agent id before (recover), else new ones."""
        capability = binding.capability
        if recover:
            entries = await self._own_pending(self._inbox(capability), most)
            if not entries:
                self.recover.discard(capability)
            return entries
        reply = await lane.command(
            "XREADGROUP", "GROUP", AGENT_GROUP, self.session.agent_id, "COUNT", most,
            "BLOCK", READ_BLOCK_MS, "STREAMS", self._inbox(capability), ">")
        return reply[0][1] if reply else []

    def _inbox(self, capability: str) -> str:
        return CapabilityKeys(self.settings.prefix, capability).inbox(self.session.agent_id)

    async def _own_pending(self, inbox: str, most: int) -> Entries:
        """Entries delivered to this agent id that this process is not running (nor reporting)."""
        mine = self.running.unreported
        out: Entries = []
        start = "0"
        while len(out) < most:
            reply: Any = await self.redis.xreadgroup(AGENT_GROUP, self.session.agent_id, {inbox: start},
                                                     count=100)
            entries: Entries = reply[0][1] if reply else []
            if not entries:
                break
            for entry_id, fields in entries:
                if fields is None:  # finished and deleted while still pending: just clear it
                    await self.redis.xack(inbox, AGENT_GROUP, entry_id)
                elif entry_id not in mine and len(out) < most:
                    out.append((entry_id, fields))
            start = entries[-1][0]
        return out

    async def begin(self, binding: Binding, entries: Entries, fresh: bool = True) -> None:
        """Start what was read; one slot per entry comes in, and every slot not used by a
        started task is released, whatever happens (entries left unaccepted stay in this
        agent's pending list and are found again by _own_pending)."""
        unused = len(entries)
        try:
            deliveries: list[Lease] = []
            for entry_id, fields in entries:
                task = parse_entry(binding.capability, entry_id, fields) if fresh else None
                if task is not None and not self.session.past(task.deadline_at_ms):
                    self._start(binding, task, False)
                    unused -= 1
                    continue
                lease = parse_lease(entry_id, fields)
                if lease is None:
                    await self._dead_letter_malformed(binding.capability, entry_id, fields)
                    continue
                deliveries.append(lease)
            if deliveries:
                unused -= await self._accept(binding, deliveries)
        finally:
            self.slots.release(unused)

    async def _accept(self, binding: Binding, deliveries: list[Lease]) -> int:
        """Accept deliveries before starting them; returns how many tasks were started."""
        session = self.session
        token = session.token
        call = accept_call(self.settings, binding.capability, session.agent_id, token, deliveries)
        reply = parse_accept(deliveries, await outages.with_reconnect(lambda: self.scripts(call)))
        if reply.refused:
            session.refused(token, f"accepting {binding.capability} tasks")
            return 0
        for accepted in reply.accepted:
            self._start(binding, accepted, True)
        return len(reply.accepted)

    async def _dead_letter_malformed(self, capability: str, entry_id: str, fields: dict[str, str]) -> None:
        inbox = self._inbox(capability)
        log.error("malformed entry %s in %s: dead-lettered", entry_id, inbox)
        await self.scripts(dead_letter_raw_call(
            self.settings, capability, inbox, AGENT_GROUP, entry_id, "malformed",
            "inbox entry without a valid task id and fence", fields,
        ))
