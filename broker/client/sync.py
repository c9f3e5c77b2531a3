"""The synchronous producer client.

    client = ReachClient.from_url("redis://localhost:6379/0")
    handle = client.submit("summarize", {"text": "..."}, priority=7)
    print(handle.result(timeout=30))

Waiting never polls: `result()` registers with the task (watch.lua, in the same step that reads
its state) and blocks on the task's `done` list (BLMOVE of the list onto itself, which wakes
every waiter and leaves it intact); `events()` follows the task's pub/sub channel after reading
the events it already has, so nothing is missed. A wait that times out raises the builtin
TimeoutError and leaves the task running.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Unpack

import redis

from broker.acl import denied, is_permission_error
from broker.client.common import FleetPolicy, batches, log, requests_for, task_keys, unserved_warning
from broker.client.follow import BLOCK_CHUNK_S, follow_events
from broker.client.tracing import producer_side, send_span
from broker.errors import QueueFull, UnknownTask
from broker.ids import check_capability, split_task_id
from broker.infra import connection, outages
from broker.keys import CapabilityKeys, Channels, RegistryKeys
from broker.models import TaskEvent, TaskStatus
from broker.ops import policy as policies
from broker.ops import schedules
from broker.ops.cancel import CancelReport, cancel_all, cancel_one, select
from broker.policy import Policy
from broker.protocol import lifecycle
from broker.protocol.calls import Status
from broker.protocol.packed_policy import FleetItems
from broker.protocol.policy import Change
from broker.protocol.submit import (
    SubmitFields,
    SubmitOptions,
    SubmitRequest,
    options_of,
    parse_submit,
    submit_call,
)
from broker.registry import clock_of
from broker.schedule import Schedule
from broker.scripts import Scripts
from broker.settings import Settings

# A task this client submitted with `submit()` has its outcome pushed to its done list, which
# lives a minute after the end (lua/_base.lua DONE_TTL_MS). Within this many seconds of the submit the
# list cannot have expired yet, so `result()` blocks on it straight away.
_FRESH_S = 30.0


class TaskHandle:
    """A submitted task. Cheap to make; every method asks Redis afresh."""

    def __init__(self, client: ReachClient, task_id: str, created: bool = True,
                 registered_at: float | None = None, capability: str | None = None) -> None:
        self._client = client
        self.task_id = task_id
        self.capability = capability or split_task_id(task_id)[0]
        self.created = created
        """False when an idempotency key matched an earlier task and this handle points to it."""
        self._registered_at = registered_at
        """When this client registered as the task's result waiter at submit (monotonic)."""

    def __repr__(self) -> str:
        return f"TaskHandle({self.task_id!r})"

    def status(self) -> TaskStatus:
        return self._client.status(self.task_id)

    def result(self, timeout: float | None = None) -> Any:
        fresh = (self._registered_at is not None
                 and time.monotonic() - self._registered_at < _FRESH_S)
        return self._client.result(self.task_id, timeout=timeout, _registered=fresh)

    def events(self, timeout: float | None = None) -> Iterator[TaskEvent]:
        return self._client.events(self.task_id, timeout=timeout)

    def cancel(self) -> bool:
        return self._client.cancel(self.task_id)


class ReachClient:
    """Submit tasks by capability and read their outcome. Thread-safe."""

    def __init__(self, settings: Settings | None = None, *,
                 redis_client: connection.SyncRedis | None = None) -> None:
        self.settings = settings or Settings.load()
        self._redis = redis_client or connection.sync_client(self.settings)
        self._scripts = Scripts(self._redis)
        self._channels = Channels(self.settings.prefix)
        self._known_capabilities: set[str] = set()
        self._fleet = FleetPolicy()

    @classmethod
    def from_url(cls, url: str, **overrides: Any) -> ReachClient:
        return cls(Settings.load(redis_url=url, **overrides))

    def close(self) -> None:
        self._redis.close()

    def __enter__(self) -> ReachClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- submitting -------------------------------------------------------------------------

    def submit(self, capability: str, payload: Any, options: SubmitOptions | None = None,
               **fields: Unpack[SubmitFields]) -> TaskHandle:
        """Queue a task for whichever agent serves `capability`.

        The options (SubmitOptions, or the same as keywords: priority, session_id, region,
        region_strict, version, idempotency_key, timeout_s, deadline_s, max_attempts, traceparent,
        tracestate, trace_id, metadata, delay_s, at) say how it is to be run; BadInput before
        anything is written. With OpenTelemetry set up, a `send {capability}` span wraps it.
        """
        chosen, otel = producer_side(options_of(options, fields))
        if otel is not None:
            with send_span(otel, capability, chosen) as send:
                handle = self._submit_one(capability, payload, send.options)
                send.sent([handle.task_id])
                return handle
        return self._submit_one(capability, payload, chosen)

    def _submit_one(self, capability: str, payload: Any, options: SubmitOptions) -> TaskHandle:
        # (A task submitted alone is usually waited for: its outcome is pushed to its done list,
        # so that result() blocks at once; submit_many leaves that to result().)
        (request,) = requests_for(self.settings, capability, [payload], options, wait=True)
        return self._write([request])[0]

    def submit_many(self, capability: str, payloads: Iterable[Any],
                    options: SubmitOptions | None = None,
                    **fields: Unpack[SubmitFields]) -> list[TaskHandle]:
        """Submit many payloads with the same options, in batched script calls.

        Every payload is validated before anything is written. If the queue fills up part-way,
        QueueFull is raised and its `.submitted` holds the handles of the tasks already queued.
        """
        (chosen, otel), payloads = producer_side(options_of(options, fields)), list(payloads)
        if otel is not None and payloads:
            with send_span(otel, capability, chosen, len(payloads)) as send:
                handles = self._write(requests_for(self.settings, capability, payloads, send.options))
                send.sent([h.task_id for h in handles])
                return handles
        requests = requests_for(self.settings, capability, payloads, chosen)
        return self._write(requests) if requests else []

    def run(self, capability: str, payload: Any, options: SubmitOptions | None = None, *,
            timeout: float | None = None, **fields: Unpack[SubmitFields]) -> Any:
        """Submit and wait for the result (TimeoutError leaves the task running)."""
        return self.submit(capability, payload, options, **fields).result(timeout=timeout)

    def _write(self, requests: Sequence[SubmitRequest]) -> list[TaskHandle]:
        capability = requests[0].capability
        handles: list[TaskHandle] = []
        with self._errors():
            self._remember_capability(capability)
            fleet = self._fleet_policy()
            for batch in batches(requests):
                call = submit_call(self.settings, batch, fleet)
                # Retrying is safe: the script refuses to create a task id twice.
                reply = outages.write_with_retry(functools.partial(self._scripts, call))
                try:
                    rows = parse_submit(capability, self.settings.max_queue_depth, reply)
                except QueueFull as exc:
                    exc.submitted = handles
                    raise
                now = time.monotonic()
                handles += [TaskHandle(self, task_id, created, now if created and batch[0].wait else None,
                                       capability)
                            for task_id, created in rows]
        return handles

    def _fleet_policy(self) -> FleetItems:
        """(A fallback's read: when Redis is away the last one stands, and the write rides
        out the outage.)"""
        if self._fleet.stale():
            with contextlib.suppress(*outages.TRANSIENT_ERRORS):
                self._fleet.take(self._redis.hgetall(RegistryKeys(self.settings.prefix).policy))
        return self._fleet.fields

    def _remember_capability(self, capability: str) -> None:
        if capability not in self._known_capabilities:
            warning = self.served_warning(capability)
            if warning:
                log.warning("%s", warning)

    def served_warning(self, capability: str) -> str | None:
        """A warning when no agent has ever served the capability (said once per client and
        capability: None the next times)."""
        if capability in self._known_capabilities:
            return None
        rk = RegistryKeys(self.settings.prefix)
        pipe = self._redis.pipeline(transaction=False)
        pipe.sadd(rk.capabilities, capability)
        pipe.sismember(rk.served, capability)
        served: Any = pipe.execute()[1]
        self._known_capabilities.add(capability)
        if served:
            return None
        names: Any = self._redis.smembers(rk.served)
        return unserved_warning(capability, names)

    # -- reading ----------------------------------------------------------------------------

    def get(self, task_id: str) -> TaskHandle:
        """A handle for an existing task id (UnknownTask if Redis does not know it)."""
        ck, local = self._keys(task_id)
        with self._errors():
            if not self._redis.exists(ck.task(local)):
                raise UnknownTask(task_id)
        return TaskHandle(self, task_id)

    def status(self, task_id: str) -> TaskStatus:
        ck, local = self._keys(task_id)
        with self._errors():
            record: Any = self._redis.hgetall(ck.task(local))
        if not record:
            raise UnknownTask(task_id)
        return TaskStatus.from_record(record)

    def result(self, task_id: str, timeout: float | None = None, *, _registered: bool = False) -> Any:
        """The task's result; TaskFailed/TaskCanceled if it ended otherwise; TimeoutError if it
        has not ended within `timeout` seconds (None: wait as long as it takes). A Redis outage
        shorter than WAIT_OUTAGE_S (a failover, a restart) is waited out."""
        ck, local = self._keys(task_id)
        done_key = ck.task_done(local)
        deadline = None if timeout is None else time.monotonic() + timeout
        outage = outages.WaitOutage(self.settings, deadline)
        registered = _registered  # (then the first look is the done list itself)
        while True:
            try:
                if not registered:
                    reply = self._scripts(lifecycle.watch_call(self.settings, task_id, "outcome", "d"))
                    if not lifecycle.task_exists(reply):
                        raise UnknownTask(task_id)
                    done, value = lifecycle.parse_outcome(task_id, reply)
                    if done:
                        return value
                registered = False
                remaining = BLOCK_CHUNK_S if deadline is None else deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"task {task_id} has not finished after {timeout}s; it keeps running")
                # (Redis reads a timeout under about 1 ms as 0, which means "block for ever".)
                pushed = self._scripts.command("BLMOVE", done_key, done_key, "RIGHT", "LEFT",
                                               max(0.01, min(remaining, BLOCK_CHUNK_S)))
                outage.over()
                if pushed is not None:
                    done, value = lifecycle.parse_done(task_id, pushed)
                    if done:
                        return value
            except outages.TRANSIENT_ERRORS as exc:
                registered = False
                time.sleep(outage.next_pause(exc))

    def events(self, task_id: str, timeout: float | None = None) -> Iterator[TaskEvent]:
        """Every event of the task from the first, then new ones live, until the terminal one.

        TimeoutError if the task has not ended within `timeout` seconds.
        """
        self._keys(task_id)
        yield from follow_events(self.settings, self._redis, self._scripts,
                                 self._channels.task(task_id), task_id, timeout, self._errors)

    # -- changing ---------------------------------------------------------------------------

    def cancel(self, task_id: str) -> bool:
        """Cancel a task wherever it is. True if this call canceled it, False if it had already
        ended; UnknownTask if Redis does not know it."""
        self._keys(task_id)
        with self._errors():
            reply = cancel_one(self._redis, self._scripts, self.settings, task_id)
        if reply.status is Status.GONE:
            raise UnknownTask(task_id)
        return reply.status is Status.CANCELED

    def cancel_many(self, capability: str, states: Iterable[str] = (), older_than_s: float | None = None,
                    *, dry_run: bool = False, progress: Callable[[int], None] | None = None) -> CancelReport:
        """Cancel the capability's unfinished tasks in `states` (queued, scheduled, retrying,
        running; all when none are given), created more than older_than_s ago if that is
        given. dry_run: only find them."""
        with self._errors():
            now = clock_of(self._redis, CapabilityKeys(self.settings.prefix, capability).queue)
            older = None if older_than_s is None else round(older_than_s * 1000)
            task_ids = select(self._redis, self.settings, capability, states, older, now)
        if dry_run:
            return CancelReport(matched=len(task_ids), task_ids=task_ids)
        return self.cancel_tasks(task_ids, progress)

    def cancel_tasks(self, task_ids: list[str],
                     progress: Callable[[int], None] | None = None) -> CancelReport:
        """Cancel each task (cancel() for many; `progress` is called once per task)."""
        with self._errors():
            return cancel_all(self._redis, self._scripts, self.settings, task_ids, progress)

    # -- policy and schedules (broker/policy.py, broker/schedule.py) ------------------------

    def policy(self, capability: str | None = None) -> Policy:
        """A capability's effective policy (None: the fleet's defaults), with sources."""
        with self._errors():
            return policies.read(self._redis, self.settings, capability)

    def set_policy(self, capability: str | None, who: str | None = None, **fields: Any) -> list[Change]:
        """Set policy fields of a capability (None: the fleet's defaults); returns the changes."""
        with self._errors():
            return policies.set_fields(self._redis, self._scripts, self.settings, capability, fields, who)

    def reset_policy(self, capability: str | None, *fields: str, who: str | None = None) -> list[Change]:
        """Reset fields (all when none are named) to what they inherit."""
        with self._errors():
            return policies.reset_fields(self._redis, self._scripts, self.settings, capability, fields, who)

    def policy_history(self, capability: str | None, count: int = 100) -> list[dict[str, Any]]:
        """The latest policy changes, newest first (field, old, new, who, at, change)."""
        with self._errors():
            return policies.history(self._redis, self.settings, capability, count)

    def pause(self, capability: str, reason: str = "") -> list[Change]:
        """Nothing of the capability starts until resume(); submits still queue."""
        return self.set_policy(capability, paused=True, paused_reason=reason)

    def resume(self, capability: str) -> list[Change]:
        return self.set_policy(capability, paused=False, paused_reason="")

    def add_schedule(self, schedule: Schedule) -> Schedule:
        with self._errors():
            return schedules.add(self._redis, self.settings, schedule)

    def schedules(self) -> list[tuple[Schedule, int]]:
        """Every schedule, with the time it last fired (ms)."""
        with self._errors():
            return schedules.list_all(self._redis, self.settings)

    # -- helpers ----------------------------------------------------------------------------

    def _keys(self, task_id: str) -> tuple[CapabilityKeys, str]:
        return task_keys(self.settings, task_id)

    def queue_depth(self, capability: str) -> int:
        check_capability(capability)
        with self._errors():
            return int(self._redis.zcard(CapabilityKeys(self.settings.prefix, capability).queue))

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except outages.TRANSIENT_ERRORS as exc:
            raise outages.unavailable(exc, self.settings) from exc
        except redis.exceptions.ResponseError as exc:
            if is_permission_error(exc):  # (the user's ACL rule: no retry fixes it)
                raise denied(exc) from exc
            raise
