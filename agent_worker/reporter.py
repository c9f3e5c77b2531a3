"""What a worker tells Redis about its tasks: their starts and outcomes, batched, with the read
of the next inbox entries riding along; and their progress.

Once per loop turn the flusher stores finished attempts (complete.lua: outcome + ack + the next
step) and records the starts of the tasks that have run START_RECORD_S and still run (accept.lua:
an agent starts a task as soon as it reads it and records the start later, dated when it
started), in one round trip. With one capability (and not on Cluster, whose pipelines refuse
EVALSHA) the slots of ended tasks are kept for that report, which also reads the next entries of
the inbox: a busy worker needs one round trip per batch, not two.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import redis

from agent_worker.attempt import Attempt, Running, about
from agent_worker.binding import Binding
from agent_worker.context import TaskContext
from agent_worker.session import AgentSession
from agent_worker.slots import Slots
from agent_worker.stats import WorkerStats
from broker import codec
from broker.infra import fatal, logs, outages
from broker.keys import AGENT_GROUP, CapabilityKeys
from broker.protocol.calls import Status
from broker.protocol.delivery import accept_call, parse_accept_statuses
from broker.protocol.reports import (
    CompleteReply,
    Completion,
    complete_call,
    parse_complete,
    parse_progress,
    progress_call,
)
from broker.scripts import AsyncScripts, Lane
from broker.settings import Settings

log = logging.getLogger("reach.worker")

COMPLETE_BATCH = 200
START_RECORD_S = 0.1
"""How long a task runs before its start is recorded. One that ends sooner is started by its
completion: a short task costs one report (and one script in Redis), not two. Meanwhile its
record says `dispatched`, which every script takes as maybe started (progress, renew, cancel,
reclaim), and the dispatchers count its slot as busy from the inbox entry read."""
Entries = list[tuple[str, dict[str, str]]]
ReadAlong = Callable[[Binding, Entries], Awaitable[None]]


class Reporter:
    def __init__(self, settings: Settings, session: AgentSession, scripts: AsyncScripts,
                 bindings: dict[str, Binding], running: Running, slots: Slots, stats: WorkerStats,
                 recover: set[str], *, piggyback: bool, read_along: ReadAlong) -> None:
        self.settings = settings
        self.session = session
        self.scripts = scripts
        self.bindings = bindings
        self.running = running
        self.slots = slots
        self.stats = stats
        self.recover = recover
        """Capabilities whose inbox the readers look at first (shared with them)."""
        self.piggyback = piggyback
        self._read_along = read_along
        """Starts what a report read (the inbox readers' begin)."""
        self._completions: dict[str, list[Completion]] = {}
        self._unrecorded: dict[str, list[Attempt]] = {}
        self._freed = 0
        """Slots of ended tasks kept for the next report's read (piggyback)."""
        self._inbox_busy = True
        """Whether the inbox held unread entries at the last report."""
        self._reporting = False
        self._flush = asyncio.Event()
        self._starts_due: asyncio.TimerHandle | None = None
        """Wakes the flusher when the oldest unrecorded start is due."""

    @property
    def pending(self) -> bool:
        """Starts or outcomes not yet stored (a draining worker waits for them)."""
        return bool(self._completions or self._unrecorded or self._reporting)

    # -- what attempts tell (attempts.AttemptSink) ------------------------------------------

    def started(self, attempt: Attempt) -> None:
        self._unrecorded.setdefault(attempt.binding.capability, []).append(attempt)
        self._wake_at(attempt.started_at + START_RECORD_S)

    def ended(self, attempt: Attempt, completion: Completion) -> None:
        self._completions.setdefault(attempt.binding.capability, []).append(completion)
        self._flush.set()

    def slot_freed(self) -> None:
        if self.piggyback:
            self._freed += 1  # (the flusher reads the next task with this one's report)
        else:
            self.slots.release(1)

    def flush_now(self) -> None:
        self._flush.set()

    # -- progress ---------------------------------------------------------------------------

    async def progress(self, ctx: TaskContext, fraction: float | None, message: str | None,
                       data: dict[str, Any]) -> bool:
        """Record a progress event; False when the attempt is no longer current (stop then)."""
        attempt = self.running.current(ctx)
        if attempt is None:
            return False
        body: dict[str, Any] = dict(data)
        if fraction is not None:
            body["fraction"] = fraction
        if message is not None:
            body["message"] = message
        # (InvalidPayload, a ValueError, to the handler: not strict JSON, or over a limit)
        text = codec.encode_payload(body, self.settings.max_progress_message_bytes, "progress",
                                    self.settings.max_json_depth, "max_progress_message_bytes")
        session = self.session
        try:
            status = parse_progress(await self.scripts(progress_call(
                self.settings, ctx.capability, attempt.lease.local_id, session.agent_id,
                session.token, attempt.lease.fence, text)))
        except outages.TRANSIENT_ERRORS as exc:
            log.warning("progress of %s not recorded: %s", ctx.task_id, exc)
            return True
        return status is Status.OK

    # -- the flusher ------------------------------------------------------------------------

    async def flusher(self) -> None:
        lane = self.scripts.lane()
        try:
            await self._flush_reports(lane)
        finally:
            if self._starts_due is not None:
                self._starts_due.cancel()
            await lane.close()

    def _wake_at(self, when: float) -> None:
        """Wake the flusher at `when` (loop clock), unless it is woken sooner already."""
        if self._starts_due is not None and self._starts_due.when() <= when:
            return
        if self._starts_due is not None:
            self._starts_due.cancel()
        self._starts_due = asyncio.get_running_loop().call_at(when, self._starts_now)

    def _starts_now(self) -> None:
        self._starts_due = None
        self._flush.set()

    def _take_due_starts(self) -> dict[str, list[Attempt]]:
        """The unrecorded starts of tasks still running that have run START_RECORD_S; the
        younger stay, and wake the flusher when the oldest of them is due."""
        if not self._unrecorded:
            return {}
        cutoff = asyncio.get_running_loop().time() - START_RECORD_S + 0.001
        by_task = self.running.by_task
        due: dict[str, list[Attempt]] = {}
        young: dict[str, list[Attempt]] = {}
        for capability, attempts in self._unrecorded.items():
            for a in attempts:
                if by_task.get(a.ctx.task_id) is a:  # (one that ended is started by its completion)
                    (due if a.started_at <= cutoff else young).setdefault(capability, []).append(a)
        self._unrecorded = young
        oldest = min((a.started_at for attempts in young.values() for a in attempts), default=None)
        if oldest is not None:
            self._wake_at(oldest + START_RECORD_S)
        return due

    async def _flush_reports(self, lane: Lane) -> None:
        pause = 0.1
        while True:
            await self._flush.wait()
            if self.running:
                # One more turn of the loop: tasks started together tend to end together, and
                # reporting them in one call costs Redis and this process much less than one
                # each (and a task that ends within the turn needs no record of its start).
                await asyncio.sleep(0)
            self._flush.clear()
            unrecorded = self._take_due_starts()
            if not (self._completions or unrecorded):
                continue
            completions, self._completions = self._completions, {}
            read, self._freed = self._freed, 0
            if self.slots.closed or not self._inbox_busy:
                # Nothing new is read while draining; and nothing is asked for when the inbox
                # was empty at the last report (the reader's blocking read catches what comes).
                self.slots.release(read)
                read = 0
            self._reporting = True
            handing, read = read, 0  # (the first report takes the slots: it releases them if it fails)
            try:
                read = await self._report_all(lane, completions, unrecorded, handing)
                pause = 0.1
            except redis.exceptions.RedisError as exc:
                if fatal.stops(exc):
                    return  # (the tasks' leases lapse: other agents run them)
                # Redis refused the report (out of memory, read-only, busy, a script error)
                # beyond what with_reconnect rides out: keep the whole batch and send it again
                # after a pause. Losing it would leave the results unstored and the tasks to
                # run again when their leases lapse; a resent report is recognised ('dup').
                log.warning("report not stored (%s); trying again in %.1fs", exc, pause)
                self._keep(completions, unrecorded)
                await asyncio.sleep(pause)
                pause = min(pause * 2, 5.0)
            finally:
                self._reporting = False
            self.slots.release(read)
            if self._completions or self._unrecorded:
                self._flush.set()  # (more came in while this report was on its way)

    async def _report_all(self, lane: Lane, completions: dict[str, list[Completion]],
                          unrecorded: dict[str, list[Attempt]], read: int) -> int:
        """Report every capability's batch; returns the read slots not handed on yet."""
        for capability in {*completions, *unrecorded}:
            starts = unrecorded.get(capability, [])
            done = completions.get(capability, [])
            for i in range(0, max(len(starts), len(done)), COMPLETE_BATCH):
                pending_read, read = read, 0  # (_report releases it if it fails)
                await self._report(lane, capability, starts[i:i + COMPLETE_BATCH],
                                   done[i:i + COMPLETE_BATCH], pending_read)
        return read

    def _keep(self, completions: dict[str, list[Completion]], unrecorded: dict[str, list[Attempt]]) -> None:
        for capability, done in completions.items():
            self._completions[capability] = done + self._completions.get(capability, [])
        for capability, starts in unrecorded.items():
            self._unrecorded[capability] = starts + self._unrecorded.get(capability, [])

    # -- one report -------------------------------------------------------------------------

    async def _report(self, lane: Lane, capability: str, starts: list[Attempt],
                      done: list[Completion], read: int = 0) -> None:
        """Record starts and store completions, and read up to `read` new entries of the inbox
        for the slots of the tasks that ended (those slots come in and are released unless a
        started task holds them), all in one round trip. Retrying is safe: a start recorded
        already is recognised ('ok'/'done'), so is a report applied already ('dup'), and the
        entries a lost reply delivered are looked for again (recover)."""
        session = self.session
        token = session.token
        calls = []
        if starts:
            now = asyncio.get_running_loop().time()
            calls.append(accept_call(self.settings, capability, session.agent_id, token,
                                     [a.lease for a in starts], started=True,
                                     ran_ms=[int((now - a.started_at) * 1000) for a in starts]))
        if done:
            calls.append(complete_call(self.settings, capability, session.agent_id, token, done))
        inbox = CapabilityKeys(self.settings.prefix, capability).inbox(session.agent_id)
        extra = [("XREADGROUP", "GROUP", AGENT_GROUP, session.agent_id, "COUNT", read, "STREAMS",
                  inbox, ">")] if read else []
        replies = await self._send(lane, capability, calls, extra, read)
        if starts:
            self._on_starts_recorded(capability, starts, replies[0], token)
        entries: Entries = []
        if read and isinstance(replies[-1], Exception):
            # (e.g. NOGROUP: the inbox went; the reader makes it again and looks there first)
            log.warning("reading inbox %s with a report failed (%s)", inbox, replies[-1])
            self.recover.add(capability)
        elif read and replies[-1]:
            entries = replies[-1][0][1]
        if done:
            self.running.unreported.difference_update(c.entry_id for c in done)
            complete = parse_complete(replies[len(calls) - 1])
            self._on_completed(capability, done, complete, token)
            # (Tasks pulled from the queue by this report mean more will come with the next.)
            self._inbox_busy = (complete.pulled > 0
                                or complete.inbox_len - complete.inbox_pending > len(entries))
        if read:
            self.slots.release(read - len(entries))
            if entries:
                await self._read_along(self.bindings[capability], entries)

    async def _send(self, lane: Lane, capability: str, calls: list[Any], extra: list[Any],
                    read: int) -> list[Any]:
        tries = 0

        async def op() -> list[Any]:
            nonlocal tries
            tries += 1
            if tries > 1 and extra:
                self.recover.add(capability)
            return await lane.run_all(calls, extra)

        try:
            replies = await outages.with_reconnect(op)
            refused = next((x for x in replies[:len(calls)] if isinstance(x, Exception)), None)
            if refused is not None:
                if extra:
                    self.recover.add(capability)  # (its read may have delivered entries)
                raise refused
        except BaseException:
            self.slots.release(read)
            raise
        return replies

    def _on_starts_recorded(self, capability: str, starts: list[Attempt], reply: list[Any],
                            token: str) -> None:
        statuses = parse_accept_statuses(reply)
        if statuses is None:
            self.session.refused(token, f"starts of {capability} tasks")
            return
        for status, attempt in zip(statuses, starts, strict=True):
            if status not in (Status.OK, Status.DONE) and self.running.is_current(attempt):
                # Canceled, expired or handed on between its dispatch and its start.
                log.warning("task %s: %s before it started here; stopping it", attempt.task_id, status,
                            extra=about(attempt))
                attempt.cancel()

    def _on_completed(self, capability: str, items: list[Completion], reply: CompleteReply,
                      token: str) -> None:
        if reply.refused:
            self.session.refused(token, f"results for {capability}")  # (their leases hand them on)
            return
        for status, item in zip(reply.statuses, items, strict=True):
            self.stats.done += 1
            if status == Status.OK:
                self.stats.succeeded += 1
            elif status == Status.STALE:
                self.stats.rejected += 1
                task_id = f"{capability}:{item.local_id}"
                log.warning("late result for %s rejected (attempt superseded)", task_id,
                            extra=logs.task_extra(logs.task_fields(task_id, None, capability, None)))
            elif status == Status.FAILED:
                self.stats.failed += 1
