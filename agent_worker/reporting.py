"""What a worker tells Redis about its tasks: their starts and results (batched by the flusher,
with the read of the next entries riding along), their progress, and the renewal of their
leases. A part of `Worker` (runtime.py), kept apart so that each file says one thing."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import redis

from agent_worker.context import TaskContext
from agent_worker.handlers import Binding
from agent_worker.stats import WorkerStats
from broker import codec, connection, protocol
from broker.keys import AGENT_GROUP, CapabilityKeys
from broker.scripts import AsyncScripts, Lane
from broker.settings import Settings

if TYPE_CHECKING:
    from agent_worker.runtime import Running

log = logging.getLogger("reach.worker")

COMPLETE_BATCH = 200


class Reporting:
    """Mixin of Worker: the reports of starts, results, progress and leases."""

    # What these methods use of the Worker (set up in its __init__ and run).
    settings: Settings
    agent_id: str
    token: str
    bindings: dict[str, Binding]
    running: dict[str, Running]
    stats: WorkerStats
    _scripts: AsyncScripts
    _report_lane: Lane
    """The connection the flusher's reports go on (a lane of its own, see broker.scripts.Lane)."""
    _flush_event: asyncio.Event
    _completions: dict[str, list[protocol.Completion]]
    _unrecorded: dict[str, list[Running]]
    _freed: int
    _stopping: bool
    _inbox_busy: bool
    _reporting: bool
    _held: set[str]
    _recover: set[str]
    _release: Callable[[int], None]
    _refused: Callable[[str, str], None]
    _cancel_running: Callable[[Running], None]
    _begin: Callable[[Binding, CapabilityKeys, list[tuple[str, dict[str, str]]], bool],
                     Awaitable[None]]

    # -- progress ---------------------------------------------------------------------------

    async def _report_progress(self, ctx: TaskContext, fraction: float | None, message: str | None,
                               data: dict[str, Any]) -> bool:
        item = self.running.get(ctx.task_id)
        if item is None or item.ctx is not ctx:
            # (an attempt that outlived its timeout, reporting while the task's next attempt
            # runs here: its report must not go out under that attempt's fence)
            return False
        body: dict[str, Any] = dict(data)
        if fraction is not None:
            body["fraction"] = fraction
        if message is not None:
            body["message"] = message
        try:
            codec.check_json_value(body, "progress")
        except codec.NotStrictJson as exc:
            raise ValueError(str(exc)) from None
        try:
            status = await self._scripts(protocol.progress_call(
                self.settings, ctx.capability, item.lease.local_id, self.agent_id, self.token,
                item.lease.fence, body,
            ))
        except connection.TRANSIENT_ERRORS as exc:
            log.warning("progress of %s not recorded: %s", ctx.task_id, exc)
            return True
        return bool(status == "ok")

    # -- completing -------------------------------------------------------------------------

    def _keep_for_next_report(self, completions: dict[str, list[protocol.Completion]],
                              unrecorded: dict[str, list[Running]]) -> None:
        for capability, done in completions.items():
            self._completions[capability] = done + self._completions.get(capability, [])
        for capability, starts in unrecorded.items():
            self._unrecorded[capability] = starts + self._unrecorded.get(capability, [])

    async def _flusher(self) -> None:
        self._report_lane = self._scripts.lane()
        try:
            await self._flush_reports()
        finally:
            await self._report_lane.close()

    async def _flush_reports(self) -> None:
        pause = 0.1
        while True:
            await self._flush_event.wait()
            if self.running:
                # One more turn of the loop: tasks started together tend to end together, and
                # reporting them in one call costs Redis and this process much less than one
                # each (and a task that ends within the turn needs no record of its start).
                await asyncio.sleep(0)
            self._flush_event.clear()
            if not (self._completions or self._unrecorded):
                continue
            completions, self._completions = self._completions, {}
            unrecorded, self._unrecorded = self._unrecorded, {}
            read, self._freed = self._freed, 0
            if self._stopping or not self._inbox_busy:
                # Nothing new is read while draining; and nothing is asked for when the inbox
                # was empty at the last report (the reader's blocking read catches what comes).
                self._release(read)
                read = 0
            self._reporting = True  # (a draining worker waits for this report before it leaves)
            try:
                for capability in {*completions, *unrecorded}:
                    # Started and still running: record the start. (Those that ended are
                    # started by their completion.)
                    starts = [item for item in unrecorded.get(capability, ())
                              if self.running.get(item.ctx.task_id) is item]
                    done = completions.get(capability, [])
                    for i in range(0, max(len(starts), len(done)), COMPLETE_BATCH):
                        pending_read, read = read, 0  # (_report releases it if it fails)
                        await self._report(capability, starts[i:i + COMPLETE_BATCH],
                                           done[i:i + COMPLETE_BATCH], pending_read)
                pause = 0.1
            except redis.exceptions.RedisError as exc:
                # Redis refused the report (out of memory, read-only, busy, a script error)
                # beyond what with_reconnect rides out: keep the whole batch and send it again
                # after a pause. Losing it would leave the results unstored and the tasks to
                # run again when their leases lapse; a resent report is recognised ('dup').
                log.warning("report not stored (%s); trying again in %.1fs", exc, pause)
                self._keep_for_next_report(completions, unrecorded)
                await asyncio.sleep(pause)
                pause = min(pause * 2, 5.0)
            finally:
                self._reporting = False
            self._release(read)
            if self._completions or self._unrecorded:
                self._flush_event.set()  # (more came in while this report was on its way)

    async def _report(self, capability: str, starts: list[Running],
                      done: list[protocol.Completion], read: int = 0) -> None:
        """Record starts and store completions, and read up to `read` new entries of the inbox
        for the slots of the tasks that ended (those slots come in and are released unless a
        started task holds them), all in one round trip. Retrying is safe: a start recorded
        already is recognised ('ok'/'done'), so is a report applied already ('dup'), and the
        entries a lost reply delivered are looked for again (_recover)."""
        calls = []
        token = self.token
        if starts:
            calls.append(protocol.accept_call(
                self.settings, capability, self.agent_id, token,
                [protocol.Delivery(i.lease.entry_id, i.lease.local_id, i.lease.fence) for i in starts],
                started=True))
        if done:
            calls.append(protocol.complete_call(self.settings, capability, self.agent_id,
                                                token, done))
        ck = CapabilityKeys(self.settings.prefix, capability)
        extra = [("XREADGROUP", "GROUP", AGENT_GROUP, self.agent_id, "COUNT", read, "STREAMS",
                  ck.inbox(self.agent_id), ">")] if read else []
        tries = 0

        async def op() -> list[Any]:
            nonlocal tries
            tries += 1
            if tries > 1 and extra:
                self._recover.add(capability)
            return await self._report_lane.run_all(calls, extra)

        try:
            replies = await connection.with_reconnect(op)
            refused = next((x for x in replies[:len(calls)] if isinstance(x, Exception)), None)
            if refused is not None:
                if extra:
                    self._recover.add(capability)  # (its read may have delivered entries)
                raise refused
        except BaseException:
            self._release(read)
            raise
        if starts:
            self._on_starts_recorded(capability, starts, replies[0], token)
        entries = []
        if read and isinstance(replies[-1], Exception):
            # (e.g. NOGROUP: the inbox went; the reader makes it again and looks there first)
            log.warning("reading inbox %s with a report failed (%s)", ck.inbox(self.agent_id),
                        replies[-1])
            self._recover.add(capability)
        elif read and replies[-1]:
            entries = replies[-1][0][1]
        if done:
            self._held.difference_update(c.entry_id for c in done)
            complete = protocol.parse_complete(replies[len(calls) - 1])
            self._on_completed(capability, done, complete, token)
            # (Tasks pulled from the queue by this report mean more will come with the next.)
            self._inbox_busy = (complete.pulled > 0
                                or complete.inbox_len - complete.inbox_pending > len(entries))
        if read:
            self._release(read - len(entries))
            if entries:
                await self._begin(self.bindings[capability], ck, entries, True)

    def _on_starts_recorded(self, capability: str, starts: list[Running], reply: list[Any],
                            token: str) -> None:
        statuses = protocol.parse_accept_statuses(reply)
        if statuses is None:
            self._refused(token, f"starts of {capability} tasks")
            return
        for status, item in zip(statuses, starts, strict=True):
            if status not in ("ok", "done") and self.running.get(item.ctx.task_id) is item:
                # Canceled, expired or handed on between its dispatch and its start.
                log.warning("task %s: %s before it started here; stopping it", item.ctx.task_id, status)
                self._cancel_running(item)

    def _on_completed(self, capability: str, items: list[protocol.Completion],
                      reply: protocol.CompleteReply, token: str) -> None:
        if reply.refused:
            # (their leases hand the tasks on)
            self._refused(token, f"results for {capability}")
            return
        for status, item in zip(reply.statuses, items, strict=True):
            self.stats.done += 1
            if status == "ok":
                self.stats.succeeded += 1
            elif status == "stale":
                self.stats.rejected += 1
                log.warning("late result for %s:%s rejected (attempt superseded)",
                            capability, item.local_id)
            elif status == "failed":
                self.stats.failed += 1

    # -- leases -----------------------------------------------------------------------------

    async def _renewer(self) -> None:
        interval = self.settings.lease_ms / 3000
        while True:
            await asyncio.sleep(interval)
            by_capability: dict[str, list[Running]] = {}
            for item in list(self.running.values()):
                by_capability.setdefault(item.binding.capability, []).append(item)
            for capability, items in by_capability.items():
                token = self.token
                try:
                    reply = await self._scripts(protocol.renew_call(
                        self.settings, capability, self.agent_id, token,
                        [item.lease for item in items],
                    ))
                except connection.TRANSIENT_ERRORS as exc:
                    log.warning("lease renewal failed (%s); will retry", exc)
                    continue
                if reply and reply[0] == "REFUSED":
                    self._refused(token, f"lease renewal of {capability} tasks")
                    continue
                for status, item in zip(reply, items, strict=True):
                    if status != "ok" and item.ctx.task_id in self.running:  # (not just finished)
                        log.warning("task %s: attempt superseded (%s); stopping it",
                                    item.ctx.task_id, status)
                        self._cancel_running(item)

