"""The attempts a worker runs: starting each from what its inbox entry (or accept.lua) gave,
ending it with an outcome for the reporter, and its execution timeout.

One timer serves the timeouts of every running attempt (attempts come and go by the thousand a
second, timeouts are rare): past its timeout an attempt is told to stop (its task cancelled,
ctx.cancelled true) and reported as a retryable failure; one that goes on STOP_WAIT_S more is
given up. Python cannot stop a thread, so a sync handler still running past its timeout keeps
its slot until its call returns ("held"), and when such handlers hold every slot the worker
stops (exit code 1) for its supervisor to start a fresh one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, Protocol

from agent_worker.attempt import STOP_WAIT_S, Attempt, Running, about
from agent_worker.binding import Binding
from agent_worker.classify import backoff_ms, describe
from agent_worker.context import ProgressSink, TaskContext
from agent_worker.executor import AttemptEnd, run_attempt
from agent_worker.metrics import WorkerMetrics
from agent_worker.slots import Slots
from agent_worker.stats import WorkerStats
from agent_worker.tracing import start_process_span
from broker import codec
from broker.infra import logs
from broker.infra import otel as otel_api
from broker.models import Outcome, ms_to_datetime
from broker.protocol.delivery import AcceptedTask, Lease
from broker.protocol.reports import Completion
from broker.settings import Settings

log = logging.getLogger("reach.worker")


class AttemptSink(Protocol):
    """Where attempts go as they start and end (the reporter)."""

    def started(self, attempt: Attempt) -> None:
        """It was started from its inbox entry: its start is still to be recorded."""

    def ended(self, attempt: Attempt, completion: Completion) -> None:
        """Its outcome, to be reported."""

    def slot_freed(self) -> None:
        """Its slot is free again."""


class Attempts:
    def __init__(self, settings: Settings, running: Running, slots: Slots, stats: WorkerStats,
                 threads: Executor, sink: AttemptSink, progress: ProgressSink,
                 tell_held: Callable[[], None], all_held: Callable[[], None],
                 retry_failures: Callable[[Binding], bool] | None = None, *,
                 metrics: WorkerMetrics | None = None, agent_id: str = "") -> None:
        self.settings = settings
        self.agent_id = agent_id
        self.running = running
        self.slots = slots
        self.stats = stats
        self.threads = threads
        self.sink = sink
        self.progress = progress
        self._tell_held = tell_held
        """The heartbeat says at once that slots are held (dispatchers send less)."""
        self._all_held = all_held
        """Every slot is held by a handler that does not stop: the worker must go."""
        self._retry_failures = retry_failures or (lambda binding: binding.retry_failures)
        self.metrics = metrics
        self._given_up: list[Attempt] = []
        self._hung_calls: dict[Future[Any], float] = {}
        """Sync handler calls still running past their attempt's timeout, and since when."""
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0

    # -- starting and ending ----------------------------------------------------------------

    def start(self, binding: Binding, task: AcceptedTask, recorded: bool) -> None:
        loop = asyncio.get_running_loop()
        timeout_ms = task.timeout_ms or binding.timeout_ms
        try:
            metadata = codec.loads(task.metadata) if task.metadata else {}
        except ValueError:
            metadata = {}
        trace = task.trace_context()
        otel = otel_api.loaded()
        span = (start_process_span(otel, binding.capability, self.agent_id, task, trace)
                if otel is not None and otel_api.spans_on(otel) else None)
        run_trace = span.trace if span is not None else trace
        ctx = TaskContext(
            task_id=task.task_id, capability=binding.capability, attempt=task.attempt,
            max_attempts=task.max_attempts, trace_id=trace.trace_id,
            session_id=task.session_id or None, deadline=ms_to_datetime(task.deadline_at_ms),
            timeout_s=timeout_ms / 1000, metadata=metadata if isinstance(metadata, dict) else {},
            traceparent=run_trace.traceparent, tracestate=run_trace.tracestate,
            _sink=self.progress, _loop=loop,
        )
        now = loop.time()
        attempt = Attempt(binding, Lease(task.entry_id, task.local_id, task.fence), ctx,
                          deadline=now + ctx.timeout_s, started_at=now, span=span)
        self.running.by_task[task.task_id] = attempt
        self.running.unreported.add(task.entry_id)
        if self.metrics is not None:
            self.metrics.started(binding.capability, task.local_id)
        # (with a span, the task runs with it current: the handler's spans are its children)
        attempt.task = asyncio.create_task(self._run(attempt, task.payload), name=task.task_id,
                                           context=span.run_context() if span else None)
        self._arm_timer(attempt.deadline)
        if not recorded:
            self.sink.started(attempt)

    async def _run(self, attempt: Attempt, payload: str) -> None:
        ctx = attempt.ctx
        # (this task's own context: its lines, and those of the threads it runs handlers on,
        # are about this task; nothing to reset, the context ends with the task)
        logs.bind_task(logs.task_fields(ctx.task_id, ctx.trace_id, ctx.capability, ctx.attempt))
        end: AttemptEnd | None = None
        try:
            end = await run_attempt(attempt.binding, ctx, payload, self.threads,
                                    self.settings.max_result_bytes, self._retry_failures(attempt.binding),
                                    max_depth=self.settings.max_json_depth)
        except asyncio.CancelledError:
            end = AttemptEnd(Outcome.RETRYABLE_FAILURE, "worker stopped before the task finished", 0)
        except Exception as exc:  # (run_attempt turns a handler's errors into outcomes: not this)
            log.exception("attempt of %s ended in an error of the worker's own", ctx.task_id)
            end = AttemptEnd(Outcome.FAILURE, f"worker error: {describe(exc)}", 0)
        finally:
            by_task = self.running.by_task
            if by_task.get(ctx.task_id) is attempt:
                del by_task[ctx.task_id]
            if end is not None and end.still_running is not None:
                self._hold_slot(ctx.task_id, end.still_running)
            else:
                self.sink.slot_freed()
            if attempt.span is not None and end is not None:
                attempt.span.end(end.outcome, end.body)
        if attempt.abandoned:
            self.slots.held -= 1
            return  # (reported when it was given up; this late end changes nothing)
        self.stats.record(end.exec_ms, end.outcome in (Outcome.SUCCESS, Outcome.INVALID_REQUEST))
        if self.metrics is not None:
            self.metrics.ended(ctx.capability, end.outcome.value, end.exec_ms)
        delay = 0
        if end.outcome is Outcome.RETRYABLE_FAILURE:
            delay = backoff_ms(ctx.attempt, self.settings)
            if end.retry_after_s is not None:
                delay = max(delay, round(end.retry_after_s * 1000))
        self.sink.ended(attempt, _completion(attempt, end.outcome, end.body, delay, end.exec_ms))

    def abandon(self, attempt: Attempt, why: str) -> None:
        """Give up a task that does not stop: report it as a retryable failure and stop
        renewing its lease (it is no longer `running` here), so that it runs again elsewhere;
        its slot stays taken until it really ends."""
        if not self.running.is_current(attempt):
            return
        log.warning("task %s: %s; giving it up", attempt.task_id, why, extra=about(attempt))
        attempt.abandoned = True
        # (only those still going matter to still_running(): the rest need not be kept)
        self._given_up = [a for a in self._given_up if a.task is not None and not a.task.done()]
        self._given_up.append(attempt)
        self.slots.held += 1  # (until its _run ends)
        self._tell_held()
        self._check_slots_left()
        del self.running.by_task[attempt.task_id]
        given_ms = round((attempt.ctx.timeout_s + STOP_WAIT_S) * 1000)
        self.stats.record(given_ms, False)
        if self.metrics is not None:
            self.metrics.ended(attempt.capability, Outcome.RETRYABLE_FAILURE.value, given_ms)
        self.sink.ended(attempt, _completion(attempt, Outcome.RETRYABLE_FAILURE, why,
                                             backoff_ms(attempt.ctx.attempt, self.settings), 0))

    # -- timeouts ---------------------------------------------------------------------------

    def _arm_timer(self, deadline: float) -> None:
        """Make sure the timeout timer fires no later than `deadline`."""
        if self._timer is None or deadline < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = deadline
            self._timer = asyncio.get_running_loop().call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        """Stop the attempts past their execution timeout (run_attempt reports them as timed
        out) and give up those told STOP_WAIT_S ago; set the timer for the next one."""
        self._timer = None
        now = asyncio.get_running_loop().time()
        earliest: float | None = None
        for attempt in self.running.attempts():
            look = attempt.deadline
            if attempt.deadline <= now:
                if not attempt.ctx._timed_out:
                    attempt.ctx._timed_out = True
                    attempt.ctx._cancelled = True  # (ctx.cancelled: this attempt is over, stop)
                    if attempt.task is not None:
                        attempt.task.cancel()
                    look = now + STOP_WAIT_S
                elif now >= attempt.deadline + STOP_WAIT_S:
                    self.abandon(attempt, f"execution timeout: ran longer than {attempt.ctx.timeout_s:g}s "
                                          f"and did not stop within {STOP_WAIT_S:g}s of being told")
                    continue
                else:
                    look = attempt.deadline + STOP_WAIT_S
            if earliest is None or look < earliest:
                earliest = look
        if earliest is not None:
            self._arm_timer(earliest)

    # -- handlers that do not stop ----------------------------------------------------------

    def _hold_slot(self, task_id: str, call: Future[Any]) -> None:
        """A sync handler went on in its thread past its attempt's timeout (the attempt is
        reported timed out): its slot stays taken until the call returns, so that this worker
        never runs more handlers at once than its concurrency."""
        loop = asyncio.get_running_loop()
        self._hung_calls[call] = loop.time()
        self.slots.held += 1
        log.warning("task %s: its handler is still running in its thread after the timeout; "
                    "its slot stays taken until it returns", task_id)
        call.add_done_callback(lambda done: self._on_call_done(loop, done))
        self._tell_held()
        # (a call that returns within STOP_WAIT_S only held its slot a moment longer)
        loop.call_later(STOP_WAIT_S, self._check_slots_left)

    def _on_call_done(self, loop: asyncio.AbstractEventLoop, call: Future[Any]) -> None:
        with contextlib.suppress(RuntimeError):  # (the loop closed: the worker has stopped)
            loop.call_soon_threadsafe(self._call_returned, call)

    def _call_returned(self, call: Future[Any]) -> None:
        if self._hung_calls.pop(call, None) is not None:
            self.slots.held -= 1
            self.slots.release(1)
            self._tell_held()

    def _check_slots_left(self) -> None:
        """When handlers that did not stop within STOP_WAIT_S of their timeout hold every slot,
        this process can run nothing more, and Python cannot stop them: it must go."""
        now = asyncio.get_running_loop().time()
        # (a timer may fire a hair early: asyncio rounds to its clock's resolution)
        calls = sum(1 for call, since in self._hung_calls.items()
                    if not call.done() and now - since >= STOP_WAIT_S - 0.001)
        # (coroutines are given up STOP_WAIT_S after their timeout already)
        if calls + self._given_up_running() >= self.slots.concurrency and not self.slots.closed:
            log.error("all %d slot(s) are held by handlers that did not stop after their "
                      "timeout; stopping so that a fresh process can take over", self.slots.concurrency)
            self._all_held()

    def _given_up_running(self) -> int:
        """Coroutines of tasks given up that have not ended yet."""
        return sum(1 for a in self._given_up
                   if a.binding.is_async and a.task is not None and not a.task.done())

    def still_running(self) -> int:
        """After the worker stopped: handlers that have not returned, of tasks given up
        (coroutines that ignore cancellation, threads blocked in a call)."""
        coroutines = self._given_up_running()
        threads = [t for t in threading.enumerate() if t.name.startswith("reach-handler")]
        for thread in threads:  # (idle ones end at once: the pool was shut down)
            thread.join(timeout=0.2)
        return coroutines + sum(1 for t in threads if t.is_alive())


def _completion(attempt: Attempt, outcome: Outcome, body: str, backoff: int, exec_ms: int) -> Completion:
    lease = attempt.lease
    return Completion(lease.entry_id, lease.local_id, lease.fence, outcome.value, body, backoff, exec_ms)
