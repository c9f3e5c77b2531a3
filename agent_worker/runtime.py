"""The worker: reads its inboxes, runs handlers, reports results, keeps its leases.

One asyncio loop per process, with these jobs running side by side:
- a reader per capability: blocks on XREADGROUP of its inbox for as many entries as it has
  free slots and starts each task at once from what its entry carries (an entry that carries
  less, or that this agent id held before this process, is accepted first: accept.lua);
- the flusher: once per loop turn, records the starts of the tasks still running (accept.lua)
  and stores finished attempts (complete.lua: result + ack + next step, and the start of an
  attempt that ended before its start was recorded), in one round trip;
- the renewer: every lease/3 extends the leases of running tasks, and stops tasks whose
  attempt was superseded;
- the control listener: cancels running tasks when their producer cancels them;
- the ticker: marks that the loop makes progress (the heartbeat thread reports its age).
The heartbeat runs on its own thread (registration.py); the reports of starts, results,
progress and leases are in reporting.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import re
import secrets
import signal
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import redis

from agent_worker.classify import backoff_ms, describe
from agent_worker.context import TaskContext
from agent_worker.executor import AttemptEnd, run_attempt
from agent_worker.handlers import Binding
from agent_worker.registration import HeartbeatThread, register, token_sha
from agent_worker.reporting import Reporting
from agent_worker.stats import WorkerStats, rss_kb, stability
from broker import codec, connection, eventloop, inbox, protocol
from broker.errors import ConfigError
from broker.keys import AGENT_GROUP, CapabilityKeys, Channels
from broker.models import AgentDescriptor, Outcome, ms_to_datetime
from broker.scripts import AsyncScripts, Lane
from broker.settings import Settings

log = logging.getLogger("reach.worker")

AGENT_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\Z")
READ_BLOCK_MS = 1000
TICK_S = 0.1


async def supervised(job: Callable[[], Awaitable[None]], name: str = "", *,
                     first_backoff_s: float = 0.5, healthy_after_s: float = 60.0) -> None:
    """Run a long-lived job; if it fails unexpectedly, log why and start it again (backing off).

    A job that dies silently would leave the process alive but useless (e.g. heartbeating while
    reading nothing), which is worse than any crash. The backoff doubles while the job keeps
    failing, and starts over once it ran `healthy_after_s` before failing: one failure a day
    must not leave a job half a minute dead because of the failures of last week.
    """
    name = name or getattr(job, "__name__", "job")
    backoff = first_backoff_s
    while True:
        started = time.monotonic()
        try:
            await job()
            return
        except asyncio.CancelledError:
            raise
        except Exception:
            if time.monotonic() - started >= healthy_after_s:
                backoff = first_backoff_s
            log.exception("%s failed unexpectedly; restarting it in %.3gs", name, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 30.0)


def default_agent_id() -> str:
    host = re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname())[:60] or "host"
    return f"{host}-{os.getpid()}-{secrets.token_hex(2)}"


def check_agent_id(agent_id: str) -> str:
    if not AGENT_ID_RE.match(agent_id):
        raise ConfigError(
            f"invalid agent id {agent_id!r}: use up to 128 letters, digits, '_', '.', '-'"
        )
    return agent_id


STOP_WAIT_S = 5.0
"""How long a task told to stop (past its execution timeout, or at the end of a drain's
grace) may go on before it is given up: reported as stopped and its lease no longer renewed. A
handler that swallows the cancellation, or a blocking call in a thread, cannot be stopped from
outside; giving it up keeps the task from staying `running` for good."""


@dataclass(eq=False)
class Running:
    binding: Binding
    lease: protocol.Lease
    ctx: TaskContext
    task: asyncio.Task[Any] | None = None
    deadline: float = 0.0
    """When its execution timeout ends (event loop clock)."""
    abandoned: bool = False
    """Told to stop and still running STOP_WAIT_S later: reported, its lease left to lapse."""


class Worker(Reporting):
    def __init__(
        self,
        settings: Settings,
        bindings: list[Binding],
        *,
        concurrency: int = 8,
        agent_id: str | None = None,
        region: str | None = None,
        version: str | None = None,
        warmup_s: float = 0.0,
        labels: dict[str, str] | None = None,
    ) -> None:
        if concurrency < 1:
            raise ConfigError("--concurrency must be at least 1")
        self.settings = settings
        self.bindings = {b.capability: b for b in bindings}
        self.concurrency = concurrency
        self.agent_id = check_agent_id(agent_id or default_agent_id())
        self.descriptor = AgentDescriptor(
            agent_id=self.agent_id, capabilities=list(self.bindings), max_concurrency=concurrency,
            region=region, version=version, warmup_s=warmup_s, labels=labels or {},
            host=socket.gethostname(), pid=os.getpid(),
        )
        self.stats = WorkerStats()
        self.token = ""
        self.running: dict[str, Running] = {}
        self._free = concurrency
        self._stopping = False
        self._last_tick = time.monotonic()
        self._max_lag_ms = 0.0
        self._completions: dict[str, list[protocol.Completion]] = {}
        self._unrecorded: dict[str, list[Running]] = {}
        """Tasks started from their inbox entry whose start is not recorded yet."""
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        """One timer for the execution timeouts of every running attempt (see _on_timer)."""
        self._freed = 0
        """Slots of ended tasks kept for the flusher, which reads the next entries with the
        report of those tasks (one round trip for both; only with one capability)."""
        self._reporting = False
        """A report is on its way (see Reporting._flusher)."""
        self._inbox_busy = True
        """Whether the inbox held unread entries at the last report (see _flusher)."""
        self._held: set[str] = set()
        """Inbox entries this process started and has not reported yet (running, or ended and
        on their way): recovering its pending entries must never start those again."""
        self._recover: set[str] = set(self.bindings)
        """Capabilities whose inbox may hold entries delivered to this agent id that no one
        runs (at start, and after a lost connection): the reader looks there first."""
        self._signals = 0
        self._given_up: list[Running] = []
        self._hung_calls: dict[Future[Any], float] = {}
        """Sync handler calls still running past their attempt's timeout (each holds a slot),
        and when that began (event loop clock)."""
        self._held_slots = 0
        """Slots taken by handlers past their timeout that have not returned (the heartbeat
        thread reads this number)."""
        self._exit_code = 0

    # -- lifecycle --------------------------------------------------------------------------

    async def run(self, *, install_signals: bool = True) -> int:
        """Serve until asked to stop (SIGTERM/SIGINT or `stop()`), then drain. Returns the exit
        code: 0, or 1 when handlers that did not stop held every slot (_check_slots_left)."""
        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        self._slot_freed = asyncio.Event()
        self._flush_event = asyncio.Event()
        self._reregister = asyncio.Event()
        self._binding = asyncio.Lock()
        """Held while registering, and while a reader binds its inbox again: a reader that
        found its inbox gone (pruned) must not write the token it knew over the one a
        registration going on at the same moment just wrote (its reports would be refused)."""
        self._refused_token = ""
        self._leaving = False
        """Set once the agent deregisters: nothing registers it again."""
        self._redis: Any = connection.async_client(self.settings)
        self._scripts = AsyncScripts(self._redis)
        self._piggyback = len(self.bindings) == 1 and not connection.is_cluster(self._redis)
        self._threads = ThreadPoolExecutor(self.concurrency + 2, thread_name_prefix="reach-handler")
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._loop.add_signal_handler(sig, self._on_signal)
        log.info("agent %s starting: %s (%s loop)", self.agent_id,
                 ", ".join(f"{c} <- {b.source}" for c, b in self.bindings.items()),
                 eventloop.loop_name(self._loop))
        self._rss_start_kb = rss_kb()
        await asyncio.to_thread(connection.check_eviction, self.settings)
        self._heartbeat = HeartbeatThread(
            self.settings, self.agent_id, lambda: self.token, self.heartbeat_stats,
            self._heartbeat_refused,
        )
        # Registration retries in the background while Redis is away; the readers wait for it.
        self._registered = asyncio.Event()
        self._reregister.set()
        jobs = [asyncio.create_task(supervised(functools.partial(self._reader, b), f"reader-{c}"),
                                    name=f"reader-{c}")
                for c, b in self.bindings.items()]
        helpers = [
            asyncio.create_task(supervised(job), name=job.__name__)
            for job in (self._flusher, self._renewer, self._control, self._ticker, self._registrar)
        ]
        log.info("agent %s ready (concurrency %d)", self.agent_id, self.concurrency)
        await self._stop_event.wait()
        await self._drain(jobs)
        for job in helpers:
            job.cancel()
        _, stuck = await asyncio.wait(helpers, timeout=5.0)
        if stuck:
            log.warning("%d helper job(s) did not stop in time", len(stuck))
        self._heartbeat.stop()
        self._threads.shutdown(wait=False, cancel_futures=True)
        with contextlib.suppress(*connection.TRANSIENT_ERRORS, TimeoutError):
            await asyncio.wait_for(self._redis.aclose(), 5.0)
        log.info("agent %s stopped", self.agent_id)
        return self._exit_code

    def stop(self) -> None:
        self._stopping = True
        self._stop_event.set()
        if hasattr(self, "_slot_freed"):
            self._slot_freed.set()  # (readers waiting for a slot see that we stop)

    def _on_signal(self) -> None:
        self._signals += 1
        if self._signals > 1:
            log.warning("second signal: exiting now")
            os._exit(1)
        log.info("signal received: draining (again to exit at once)")
        self.stop()

    def _heartbeat_refused(self, token: str) -> None:
        self._loop.call_soon_threadsafe(self._refused, token, "")

    def _refused(self, token: str, what: str) -> None:
        """Redis refused `token` (for `what`): register again, once however many calls carried
        it. A token replaced since the call went out says nothing about the new one, and
        registering once more would only make the calls now in flight refused in turn."""
        if token != self.token:
            log.info("%s refused for a token replaced since", what or "heartbeat")
            return
        if self._leaving:
            return  # (deregistered: refusals are expected now)
        if what:
            log.error("%s refused (token); registering again", what)
        self._refused_token = token
        self._reregister.set()

    async def _register(self) -> str:
        return await register(self.settings, self._redis, self._scripts, self.descriptor)

    async def _registrar(self) -> None:
        """Registers at start, and again whenever the registry refused our token (e.g. the
        record was pruned while we were partitioned away)."""
        while True:
            await self._reregister.wait()
            self._reregister.clear()
            if self._leaving:
                return
            if self._registered.is_set() and self._refused_token != self.token:
                continue  # (refused more than once; registered again since the first)
            async with self._binding:
                self.token = await connection.with_reconnect(self._register)
            if not self._registered.is_set():
                self._registered.set()
                self._heartbeat.start()  # its first beat goes out at once
                log.info("agent %s registered", self.agent_id)
            else:
                self._heartbeat.beat_now()

    async def _drain(self, readers: list[asyncio.Task[None]]) -> None:
        grace = self.settings.drain_grace_ms / 1000
        log.info("draining: %d task(s) in flight, grace %.0fs", len(self.running), grace)
        if not self._registered.is_set():
            for reader in readers:
                reader.cancel()
            return
        self._heartbeat.beat_now("draining")
        for capability in self.bindings:
            # Dispatchers read the registry a moment late; this marker, next to the agent's
            # token in the capability's own hash slot, stops dispatch.lua at once.
            with contextlib.suppress(*connection.TRANSIENT_ERRORS):
                await self._redis.hset(CapabilityKeys(self.settings.prefix, capability).tokens,
                                       f"draining:{self.agent_id}", "1")
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
        for capability in self.bindings:  # unread tasks go to other agents at once
            with contextlib.suppress(*connection.TRANSIENT_ERRORS):
                released = await inbox.release_unread(self._redis, self._scripts, self.settings,
                                                      capability, self.agent_id, "agent draining")
                if released:
                    log.info("handed %d unread %s task(s) back to the queue", released, capability)
        deadline = time.monotonic() + grace
        while self.running and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for item in list(self.running.values()):
            # Past the grace period: stop them and report "worker stopped" (retryable), so they
            # run again elsewhere. (Not ctx._cancel(): that means the producer canceled.)
            if item.task is not None:
                item.task.cancel()
        deadline = time.monotonic() + STOP_WAIT_S
        while self.running and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for item in list(self.running.values()):
            self._abandon(item, "worker stopped before the task finished (it did not stop when told)")
        self._flush_event.set()
        while self._completions or self._unrecorded or self._reporting:
            await asyncio.sleep(0.01)  # (every result is reported before the agent leaves)
        # Leaving for good: a refusal from now on (a beat on its way meets the record gone)
        # must not register the agent again, which would leave a record no process stands for.
        self._leaving = True
        self._heartbeat.stop()
        with contextlib.suppress(*connection.TRANSIENT_ERRORS):
            await self._scripts(protocol.deregister_call(self.settings, self.agent_id, self.token))
            for capability in self.bindings:
                ck = CapabilityKeys(self.settings.prefix, capability)
                await self._redis.hdel(ck.tokens, self.agent_id, f"draining:{self.agent_id}")
                if not await self._redis.xlen(ck.inbox(self.agent_id)):
                    await self._redis.delete(ck.inbox(self.agent_id))
                    await self._redis.srem(ck.inboxes, self.agent_id)

    # -- slots ------------------------------------------------------------------------------
    # A plain counter: everything runs on one event loop, so no lock is needed.

    async def _reserve(self, most: int) -> int:
        while self._free <= 0 and not self._stopping:
            self._slot_freed.clear()
            await self._slot_freed.wait()
        if self._stopping:
            return 0
        n = min(most, self._free)
        self._free -= n
        return n

    def _release(self, n: int) -> None:
        if n > 0:
            self._free += n
            self._slot_freed.set()

    # -- reading and accepting --------------------------------------------------------------

    async def _reader(self, binding: Binding) -> None:
        await self._registered.wait()
        ck = CapabilityKeys(self.settings.prefix, binding.capability)
        inbox = ck.inbox(self.agent_id)
        share = max(1, self.concurrency // len(self.bindings))
        lane = self._scripts.lane()  # (a connection of its own for the blocking reads)
        try:
            await self._read_inbox(binding, ck, inbox, share, lane)
        finally:
            await lane.close()

    async def _read_inbox(self, binding: Binding, ck: CapabilityKeys, inbox: str, share: int,
                          lane: Lane) -> None:
        backoff = 0.1
        # At start and after every lost connection, first look at entries already delivered to
        # this agent id: a reply lost in a Redis restart, or an earlier process of the same id.
        while not self._stopping:
            held = await self._reserve(share)  # slots this loop holds (released exactly once)
            if held == 0:
                return
            try:
                recover = binding.capability in self._recover
                fresh = not recover
                if recover:
                    entries = await self._own_pending(inbox, held)
                    if not entries:
                        self._recover.discard(binding.capability)
                else:
                    reply = await lane.command(
                        "XREADGROUP", "GROUP", AGENT_GROUP, self.agent_id, "COUNT", held,
                        "BLOCK", READ_BLOCK_MS, "STREAMS", inbox, ">")
                    entries = reply[0][1] if reply else []
                self._release(held - len(entries))
                held = 0
                if entries:
                    await self._begin(binding, ck, entries, fresh)  # owns one slot per entry
                    # Let the tasks just started run, and the report of those that end at once
                    # go out, before the next (blocking) read is sent: that read can wait a
                    # moment, a producer waiting for a result cannot.
                    await asyncio.sleep(0)
                    await asyncio.sleep(0)
                backoff = 0.1
            except connection.TRANSIENT_ERRORS as exc:  # (before ResponseError: CLUSTERDOWN is one)
                self._release(held)
                self._recover.add(binding.capability)
                log.warning("reading inbox %s failed (%s); retrying in %.1fs", inbox, exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
            except redis.exceptions.ResponseError as exc:
                self._release(held)
                self._recover.add(binding.capability)
                if "NOGROUP" in str(exc):  # the inbox was deleted under us: make it again
                    async with self._binding:
                        await self._scripts(protocol.bind_call(
                            self.settings, binding.capability, self.agent_id, token_sha(self.token)))
                    continue
                # Anything else is unexpected: say so loudly, but never stop reading.
                log.exception("reading inbox %s failed; retrying in %.1fs", inbox, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    async def _own_pending(self, inbox: str, most: int) -> list[tuple[str, dict[str, str]]]:
        """Entries delivered to this agent id that this process is not running (nor reporting)."""
        mine = self._held
        out: list[tuple[str, dict[str, str]]] = []
        start = "0"
        while len(out) < most:
            reply = await self._redis.xreadgroup(AGENT_GROUP, self.agent_id, {inbox: start},
                                                 count=100)
            entries = reply[0][1] if reply else []
            if not entries:
                break
            for entry_id, fields in entries:
                if fields is None:  # finished and deleted while still pending: just clear it
                    await self._redis.xack(inbox, AGENT_GROUP, entry_id)
                elif entry_id not in mine and len(out) < most:
                    out.append((entry_id, fields))
            start = entries[-1][0]
        return out

    async def _begin(self, binding: Binding, ck: CapabilityKeys,
                     entries: list[tuple[str, dict[str, str]]], fresh: bool) -> None:
        """Start what was read; one slot per entry comes in, and every slot not used by a
        started task is released, whatever happens (entries left unaccepted stay in this
        agent's pending list and are found again by _own_pending).

        A fresh entry (first delivered to this process) that carries the task starts at once:
        only the delivery the task expects is ever in an inbox unread (a reclaim, release or
        cancel takes its entry out in the same step), so its start is recorded afterwards
        (_flusher). An entry that carries less, one this agent id held before (a restart), or
        one whose deadline has passed is accepted first (accept.lua checks it)."""
        unused = len(entries)
        try:
            deliveries: list[protocol.Delivery] = []
            for entry_id, fields in entries:
                task = inbox.parse_delivery(binding.capability, entry_id, fields) if fresh else None
                if task is not None and not self._past(task.deadline_at_ms):
                    self._start(binding, task, recorded=False)
                    unused -= 1
                    continue
                lease = inbox.parse_lease(entry_id, fields)
                if lease is None:
                    await self._dead_letter_malformed(binding.capability, ck.inbox(self.agent_id),
                                                      entry_id, fields)
                    continue
                deliveries.append(protocol.Delivery(entry_id, lease.local_id, lease.fence))
            if deliveries:
                unused -= await self._accept_entries(binding, deliveries)
        finally:
            self._release(unused)

    def _past(self, deadline_at_ms: int) -> bool:
        """Whether a deadline (Redis server clock) has passed, as far as this host can tell."""
        if not deadline_at_ms:
            return False
        offset = self._heartbeat.clock_offset_ms
        return offset is None or time.time() * 1000 + offset >= deadline_at_ms

    async def _accept_entries(self, binding: Binding, deliveries: list[protocol.Delivery]) -> int:
        """Accept deliveries before starting them; returns how many tasks were started."""
        token = self.token
        call = protocol.accept_call(self.settings, binding.capability, self.agent_id, token,
                                    deliveries)
        reply = await connection.with_reconnect(lambda: self._scripts(call))
        parsed = protocol.parse_accept(deliveries, reply)
        if parsed.refused:
            self._refused(token, f"accepting {binding.capability} tasks")
            return 0
        for accepted in parsed.accepted:
            self._start(binding, accepted, recorded=True)
        return len(parsed.accepted)

    async def _dead_letter_malformed(self, capability: str, stream: str, entry_id: str,
                                     fields: dict[str, str]) -> None:
        log.error("malformed entry %s in %s: dead-lettered", entry_id, stream)
        await self._scripts(protocol.dead_letter_raw_call(
            self.settings, capability, stream, AGENT_GROUP, entry_id, "malformed",
            "inbox entry without a valid task id and fence", fields,
        ))

    # -- running ----------------------------------------------------------------------------

    def _start(self, binding: Binding, task: protocol.AcceptedTask, recorded: bool) -> None:
        deadline = ms_to_datetime(task.deadline_at_ms)
        timeout_ms = task.timeout_ms or binding.timeout_ms
        try:
            metadata = codec.loads(task.metadata) if task.metadata else {}
        except ValueError:
            metadata = {}
        ctx = TaskContext(
            task_id=task.task_id, capability=binding.capability, attempt=task.attempt,
            max_attempts=task.max_attempts, trace_id=task.trace_id,
            session_id=task.session_id or None, deadline=deadline, timeout_s=timeout_ms / 1000,
            metadata=metadata if isinstance(metadata, dict) else {},
            _sink=self._report_progress, _loop=self._loop,
        )
        item = Running(binding, protocol.Lease(task.entry_id, task.local_id, task.fence), ctx,
                       deadline=self._loop.time() + ctx.timeout_s)
        self.running[task.task_id] = item
        self._held.add(task.entry_id)
        item.task = asyncio.create_task(self._run(item, task.payload), name=task.task_id)
        self._arm_timer(item.deadline)
        if not recorded:
            self._unrecorded.setdefault(binding.capability, []).append(item)
            self._flush_event.set()

    async def _run(self, item: Running, payload: str) -> None:
        ctx = item.ctx
        end: AttemptEnd | None = None
        try:
            end = await run_attempt(item.binding, ctx, payload, self._threads,
                                    self.settings.max_payload_bytes)
        except asyncio.CancelledError:
            end = AttemptEnd(Outcome.RETRYABLE_FAILURE, "worker stopped before the task finished", 0)
        except Exception as exc:  # (run_attempt turns a handler's errors into outcomes: not this)
            log.exception("attempt of %s ended in an error of the worker's own", ctx.task_id)
            end = AttemptEnd(Outcome.FAILURE, f"worker error: {describe(exc)}", 0)
        finally:
            if self.running.get(ctx.task_id) is item:
                del self.running[ctx.task_id]
            if end is not None and end.still_running is not None:
                self._hold_slot(ctx.task_id, end.still_running)
            elif self._piggyback:
                self._freed += 1  # (the flusher reads the next task with this one's report)
            else:
                self._release(1)
        if item.abandoned:
            self._held_slots -= 1
            return  # (reported when it was given up; this late end changes nothing)
        self.stats.record(end.exec_ms, end.outcome in (Outcome.SUCCESS, Outcome.INVALID_REQUEST))
        delay = 0
        if end.outcome is Outcome.RETRYABLE_FAILURE:
            delay = backoff_ms(ctx.attempt, self.settings)
            if end.retry_after_s is not None:
                delay = max(delay, round(end.retry_after_s * 1000))
        self._completions.setdefault(item.binding.capability, []).append(protocol.Completion(
            item.lease.entry_id, item.lease.local_id, item.lease.fence, end.outcome.value,
            end.body, delay, end.exec_ms,
        ))
        self._flush_event.set()

    def _arm_timer(self, deadline: float) -> None:
        """Make sure the timeout timer fires no later than `deadline`."""
        if self._timer is None or deadline < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = deadline
            self._timer = self._loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        """Stop the attempts past their execution timeout (run_attempt reports them as timed
        out, a retryable failure) and set the timer for the next one. One timer, looked at
        once per expiry, instead of one per attempt: attempts come and go by the thousand a
        second, timeouts are rare."""
        self._timer = None
        now = self._loop.time()
        earliest: float | None = None
        for item in list(self.running.values()):
            look = item.deadline
            if item.deadline <= now:
                if not item.ctx._timed_out:
                    item.ctx._timed_out = True
                    item.ctx._cancelled = True  # (ctx.cancelled: this attempt is over, stop)
                    if item.task is not None:
                        item.task.cancel()
                    look = now + STOP_WAIT_S
                elif now >= item.deadline + STOP_WAIT_S:
                    self._abandon(item, f"execution timeout: ran longer than {item.ctx.timeout_s:g}s "
                                        f"and did not stop within {STOP_WAIT_S:g}s of being told")
                    continue
                else:
                    look = item.deadline + STOP_WAIT_S
            if earliest is None or look < earliest:
                earliest = look
        if earliest is not None:
            self._arm_timer(earliest)

    def _hold_slot(self, task_id: str, call: Future[Any]) -> None:
        """A sync handler went on in its thread past its attempt's timeout (the attempt is
        reported timed out, to be retried): its slot stays taken until the call returns, so
        that this worker never runs more handlers at once than its concurrency, and its
        heartbeat tells the dispatchers (`held_slots`) to send it that much less."""
        self._hung_calls[call] = self._loop.time()
        self._held_slots += 1
        log.warning("task %s: its handler is still running in its thread after the timeout; "
                    "its slot stays taken until it returns", task_id)
        call.add_done_callback(self._on_call_done)
        self._heartbeat.beat_now()
        # (a call that returns within STOP_WAIT_S only held its slot a moment longer)
        self._loop.call_later(STOP_WAIT_S, self._check_slots_left)

    def _on_call_done(self, call: Future[Any]) -> None:  # (in the handler's thread)
        with contextlib.suppress(RuntimeError):  # (the loop closed: the worker has stopped)
            self._loop.call_soon_threadsafe(self._call_returned, call)

    def _call_returned(self, call: Future[Any]) -> None:
        if self._hung_calls.pop(call, None) is not None:
            self._held_slots -= 1
            self._release(1)
            self._heartbeat.beat_now()

    def _check_slots_left(self) -> None:
        """When handlers that did not stop within STOP_WAIT_S of their timeout hold every
        slot, this process can run nothing more, and Python cannot stop them: it stops
        (handing its unread tasks back, exit code 1) so that whatever supervises it starts a
        fresh one, instead of staying registered with nothing to run its tasks on."""
        now = self._loop.time()
        # (a timer may fire a hair early: asyncio rounds to its clock's resolution)
        calls = sum(1 for call, since in self._hung_calls.items()
                    if not call.done() and now - since >= STOP_WAIT_S - 0.001)
        # (coroutines are given up STOP_WAIT_S after their timeout already)
        if calls + self._given_up_running() >= self.concurrency and not self._stopping:
            log.error("all %d slot(s) are held by handlers that did not stop after their "
                      "timeout; stopping so that a fresh process can take over", self.concurrency)
            self._exit_code = 1
            self.stop()

    def _given_up_running(self) -> int:
        """Coroutines of tasks given up that have not ended yet."""
        return sum(1 for item in self._given_up
                   if item.binding.is_async and item.task is not None and not item.task.done())

    def still_running(self) -> int:
        """After run(): handlers that have not returned, of tasks given up (coroutines that
        ignore cancellation, threads blocked in a call)."""
        coroutines = self._given_up_running()
        threads = [t for t in threading.enumerate() if t.name.startswith("reach-handler")]
        for thread in threads:  # (idle ones end at once: the pool was shut down)
            thread.join(timeout=0.2)
        return coroutines + sum(1 for t in threads if t.is_alive())

    def _abandon(self, item: Running, why: str) -> None:
        """Give up a task that does not stop: report it as a retryable failure and stop
        renewing its lease (it is no longer `running` here), so that it runs again elsewhere;
        its slot stays taken until it really ends."""
        if self.running.get(item.ctx.task_id) is not item:
            return
        log.warning("task %s: %s; giving it up", item.ctx.task_id, why)
        item.abandoned = True
        # (only those still going matter to still_running(): the rest need not be kept)
        self._given_up = [i for i in self._given_up if i.task is not None and not i.task.done()]
        self._given_up.append(item)
        self._held_slots += 1  # (until its _run ends)
        self._heartbeat.beat_now()
        self._check_slots_left()
        del self.running[item.ctx.task_id]
        self.stats.record(round((item.ctx.timeout_s + STOP_WAIT_S) * 1000), False)
        self._completions.setdefault(item.binding.capability, []).append(protocol.Completion(
            item.lease.entry_id, item.lease.local_id, item.lease.fence,
            Outcome.RETRYABLE_FAILURE.value, why, backoff_ms(item.ctx.attempt, self.settings), 0,
        ))
        self._flush_event.set()

    def _cancel_running(self, item: Running) -> None:
        item.ctx._cancel()
        if item.binding.is_async and item.task is not None:
            item.task.cancel()

    # -- control and health -----------------------------------------------------------------

    async def _control(self) -> None:
        channel = Channels(self.settings.prefix).control(self.agent_id)
        while True:
            pubsub = None
            try:
                pubsub = await connection.open_async_pubsub(self._redis)
                await pubsub.subscribe(channel)
                while True:
                    message = await pubsub.get_message(timeout=5.0)
                    if message and message.get("type") == "message":
                        self._on_control(str(message["data"]))
            except connection.TRANSIENT_ERRORS as exc:
                log.warning("control channel lost (%s); resubscribing", exc)
                await asyncio.sleep(1.0)
            finally:
                if pubsub is not None:
                    with contextlib.suppress(*connection.TRANSIENT_ERRORS):
                        await pubsub.aclose()

    def _on_control(self, text: str) -> None:
        verb, _, arg = text.partition(" ")
        if verb == "cancel":
            item = self.running.get(arg)
            if item is not None:
                log.info("task %s canceled by its producer", arg)
                self._cancel_running(item)

    async def _ticker(self) -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(TICK_S)
            now = time.monotonic()
            lag_ms = (now - before - TICK_S) * 1000
            self._max_lag_ms = max(self._max_lag_ms * 0.9, lag_ms)
            self._last_tick = now

    def heartbeat_stats(self) -> dict[str, Any]:
        """Numbers for the registry (advisory; routing counts load from Redis itself)."""
        rss = rss_kb()
        health = self.stats.health()
        progress_age_ms = round((time.monotonic() - self._last_tick) * 1000)
        return {
            "inflight": len(self.running),
            "max_concurrency": self.concurrency,
            "free_slots": self._free,
            "held_slots": self._held_slots,
            "loop_progress_age_ms": progress_age_ms,
            "stalled": progress_age_ms >= self.settings.stall_after_ms and bool(self.running),
            "loop_lag_ms": round(self._max_lag_ms, 1),
            "latency_p50_ms": self.stats.latency_p50_ms(),
            "latency_baseline_ms": self.stats.latency_baseline_ms(),
            "success_rates": self.stats.success_rates(),
            "health": health,
            "stability": stability(health, self._max_lag_ms),
            "done": self.stats.done,
            "failed": self.stats.failed,
            "rejected": self.stats.rejected,
            "rss_kb": rss,
            "rss_growth_kb": rss - self._rss_start_kb if rss and self._rss_start_kb else None,
            "draining": self._stopping,
        }
