"""The asyncio producer client; mirrors ReachClient with `await` and `async for`.

    async with AsyncReachClient.from_url("redis://localhost:6379/0") as client:
        handle = await client.submit("summarize", {"text": "..."})
        async for event in handle.events():
            print(event.type)

All waits of one client share one pub/sub connection (see broker/client/listener.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Unpack

import redis

from broker.acl import denied, is_permission_error
from broker.client.common import FleetPolicy, batches, log, requests_for, task_keys, unserved_warning
from broker.client.events import TERMINAL_STATES, event_ends_story, message_is_terminal
from broker.client.listener import TaskListener
from broker.client.tracing import producer_side, send_span
from broker.errors import QueueFull, UnknownTask
from broker.ids import split_task_id
from broker.infra import connection, outages
from broker.keys import CapabilityKeys, Channels, RegistryKeys
from broker.models import TaskEvent, TaskStatus
from broker.ops.cancel import CANCEL_FOLLOWS
from broker.protocol import lifecycle
from broker.protocol.calls import ScriptCall, Status
from broker.protocol.submit import (
    SubmitFields,
    SubmitOptions,
    SubmitRequest,
    options_of,
    parse_submit,
    submit_call,
)
from broker.scripts import AsyncScripts
from broker.settings import Settings

# With no message for this long a wait reads the record again: a safety net for a pub/sub
# message lost to a reconnect, not a polling loop.
_RECHECK_S = 5.0


class AsyncTaskHandle:
    def __init__(self, client: AsyncReachClient, task_id: str, created: bool = True,
                 capability: str | None = None) -> None:
        self._client = client
        self.task_id = task_id
        self.capability = capability or split_task_id(task_id)[0]
        self.created = created

    def __repr__(self) -> str:
        return f"AsyncTaskHandle({self.task_id!r})"

    async def status(self) -> TaskStatus:
        return await self._client.status(self.task_id)

    async def result(self, timeout: float | None = None) -> Any:
        return await self._client.result(self.task_id, timeout=timeout)

    def events(self, timeout: float | None = None) -> AsyncIterator[TaskEvent]:
        return self._client.events(self.task_id, timeout=timeout)

    async def cancel(self) -> bool:
        return await self._client.cancel(self.task_id)


class AsyncReachClient:
    def __init__(self, settings: Settings | None = None, *,
                 redis_client: connection.AsyncRedis | None = None) -> None:
        self.settings = settings or Settings.load()
        self._redis = redis_client or connection.async_client(self.settings)
        self._scripts = AsyncScripts(self._redis)
        self._lane = self._scripts.lane()
        """The connection the client keeps for its submits and result reads, as the synchronous
        client keeps one per thread: the pool and redis-py's execute_command cost a submit
        more CPU than its round trip (a busy lane: a pooled connection, the same lean way)."""
        self._channels = Channels(self.settings.prefix)
        self._listener: TaskListener | None = None
        self._known_capabilities: set[str] = set()
        self._fleet = FleetPolicy()

    @classmethod
    def from_url(cls, url: str, **overrides: Any) -> AsyncReachClient:
        return cls(Settings.load(redis_url=url, **overrides))

    async def close(self) -> None:
        if self._listener is not None:
            await self._listener.close()
        await self._lane.close()
        await self._redis.aclose()

    async def __aenter__(self) -> AsyncReachClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def submit(self, capability: str, payload: Any, options: SubmitOptions | None = None,
                     **fields: Unpack[SubmitFields]) -> AsyncTaskHandle:
        """Queue a task (see ReachClient.submit). Its waits follow the task's channel on the
        client's one pub/sub connection, so the outcome is not pushed to a done list."""
        chosen, otel = producer_side(options_of(options, fields))
        if otel is not None:
            with send_span(otel, capability, chosen) as send:
                (request,) = requests_for(self.settings, capability, [payload], send.options)
                handle = (await self._write([request]))[0]
                send.sent([handle.task_id])
                return handle
        (request,) = requests_for(self.settings, capability, [payload], chosen)
        return (await self._write([request]))[0]

    async def submit_many(self, capability: str, payloads: Iterable[Any],
                          options: SubmitOptions | None = None,
                          **fields: Unpack[SubmitFields]) -> list[AsyncTaskHandle]:
        (chosen, otel), payloads = producer_side(options_of(options, fields)), list(payloads)
        if otel is not None and payloads:
            with send_span(otel, capability, chosen, len(payloads)) as send:
                requests = requests_for(self.settings, capability, payloads, send.options)
                handles = await self._write(requests)
                send.sent([h.task_id for h in handles])
                return handles
        requests = requests_for(self.settings, capability, payloads, chosen)
        return await self._write(requests) if requests else []

    async def run(self, capability: str, payload: Any, options: SubmitOptions | None = None, *,
                  timeout: float | None = None, **fields: Unpack[SubmitFields]) -> Any:
        handle = await self.submit(capability, payload, options, **fields)
        return await handle.result(timeout=timeout)

    async def _write(self, requests: Sequence[SubmitRequest]) -> list[AsyncTaskHandle]:
        capability = requests[0].capability
        handles: list[AsyncTaskHandle] = []
        with self._errors():
            if capability not in self._known_capabilities:
                await self._remember_capability(capability)
            if self._fleet.stale():
                with contextlib.suppress(*outages.TRANSIENT_ERRORS):  # (the last one stands)
                    self._fleet.take(await self._redis.hgetall(RegistryKeys(self.settings.prefix).policy))
            for batch in batches(requests):
                call = submit_call(self.settings, batch, self._fleet.fields)
                reply = await outages.async_write_with_retry(functools.partial(self._run, call))
                try:
                    rows = parse_submit(capability, self.settings.max_queue_depth, reply)
                except QueueFull as exc:
                    exc.submitted = handles
                    raise
                handles += [AsyncTaskHandle(self, task_id, created, capability)
                            for task_id, created in rows]
        return handles

    async def _run(self, call: ScriptCall) -> Any:
        (reply,) = await self._scripts.run_all([call], lane=self._lane)
        return reply

    async def _remember_capability(self, capability: str) -> None:
        rk = RegistryKeys(self.settings.prefix)
        pipe = self._redis.pipeline(transaction=False)
        pipe.sadd(rk.capabilities, capability)
        pipe.sismember(rk.served, capability)
        served: Any = (await pipe.execute())[1]
        self._known_capabilities.add(capability)
        if not served:
            names: Any = await self._redis.smembers(rk.served)
            log.warning("%s", unserved_warning(capability, names))

    async def get(self, task_id: str) -> AsyncTaskHandle:
        ck, local = self._keys(task_id)
        with self._errors():
            if not await self._redis.exists(ck.task(local)):
                raise UnknownTask(task_id)
        return AsyncTaskHandle(self, task_id)

    async def status(self, task_id: str) -> TaskStatus:
        ck, local = self._keys(task_id)
        with self._errors():
            record: Any = await self._redis.hgetall(ck.task(local))
        if not record:
            raise UnknownTask(task_id)
        return TaskStatus.from_record(record)

    async def result(self, task_id: str, timeout: float | None = None) -> Any:
        self._keys(task_id)
        deadline = None if timeout is None else time.monotonic() + timeout
        outage = outages.WaitOutage(self.settings, deadline)
        channel = self._channels.task(task_id)
        listener = self._get_listener()
        queue = await self._watch(listener, channel, outage)
        try:
            while True:
                try:
                    # (subscribed first: whatever ends the task after this call is published)
                    reply = await self._run(lifecycle.watch_call(self.settings, task_id, "outcome", "w"))
                    outage.over()
                except outages.TRANSIENT_ERRORS as exc:
                    await asyncio.sleep(outage.next_pause(exc))
                    continue
                if not lifecycle.task_exists(reply):
                    raise UnknownTask(task_id)
                done, value = lifecycle.parse_outcome(task_id, reply)
                if done:
                    return value
                pushed = await self._wait_for_terminal(queue, deadline, task_id, timeout)
                if pushed is not None:
                    done, value = lifecycle.parse_done(task_id, pushed)
                    if done:
                        return value
        finally:
            await listener.unwatch(channel, queue)

    async def _watch(self, listener: TaskListener, channel: str,
                     outage: outages.WaitOutage) -> asyncio.Queue[str | None]:
        while True:
            try:
                queue = await listener.watch(channel)
                outage.over()
                return queue
            except outages.TRANSIENT_ERRORS as exc:
                await asyncio.sleep(outage.next_pause(exc))

    async def _wait_for_terminal(
        self, queue: asyncio.Queue[str | None], deadline: float | None, task_id: str,
        timeout: float | None,
    ) -> str | None:
        """Wait for the task's end: its outcome as published (lua/_finish.lua), or None when
        the record must be read (a terminal event without it at hand, a reconnect, a recheck)."""
        while True:
            remaining = _RECHECK_S if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"task {task_id} has not finished after {timeout}s; it keeps running")
            try:
                message = await asyncio.wait_for(queue.get(), min(remaining, _RECHECK_S))
            except TimeoutError:
                return None
            ended = False
            while True:  # (what came with it too: the outcome follows a terminal event at once)
                if message is None:
                    return None
                pushed = lifecycle.done_message(message)
                if pushed is not None:
                    return pushed
                ended = ended or message_is_terminal(message)
                if queue.empty():
                    break
                message = queue.get_nowait()
            if ended:
                return None

    async def events(self, task_id: str, timeout: float | None = None) -> AsyncIterator[TaskEvent]:
        self._keys(task_id)
        deadline = None if timeout is None else time.monotonic() + timeout
        outage = outages.WaitOutage(self.settings, deadline)
        channel = self._channels.task(task_id)
        listener = self._get_listener()
        last = 0
        ended = False
        seen = False
        queue = await self._watch(listener, channel, outage)
        try:
            while True:
                try:
                    state, _, fresh = lifecycle.parse_events(await self._scripts(
                        lifecycle.watch_call(self.settings, task_id, "events", "w", last)))
                    outage.over()
                except outages.TRANSIENT_ERRORS as exc:
                    await asyncio.sleep(outage.next_pause(exc))
                    continue
                if state is None:
                    if not seen:
                        raise UnknownTask(task_id)
                    return  # the record expired under us: nothing more will come
                seen = True
                for event in fresh:
                    last = event.seq
                    ended = event_ends_story(event, ended)
                    yield event
                if fresh and ended and state in TERMINAL_STATES:
                    return  # the last lifecycle event is terminal (and no replay followed)
                if len(fresh) == 1000:
                    continue  # more to read at once
                remaining = _RECHECK_S if deadline is None else deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"task {task_id} has not finished after {timeout}s; it keeps running")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(queue.get(), min(remaining, _RECHECK_S))
                while not queue.empty():
                    queue.get_nowait()  # one read covers the burst
        finally:
            await listener.unwatch(channel, queue)

    async def cancel(self, task_id: str) -> bool:
        ck, local = self._keys(task_id)
        with self._errors():
            agent: Any = await self._redis.hget(ck.task(local), "agent_id") or ""
            for _ in range(CANCEL_FOLLOWS):
                reply = lifecycle.parse_cancel(
                    await self._scripts(lifecycle.cancel_call(self.settings, task_id, agent)))
                if reply.status is not Status.MOVED:
                    break
                agent = reply.detail  # it moved to another agent meanwhile: follow it
        if reply.status is Status.GONE:
            raise UnknownTask(task_id)
        return reply.status is Status.CANCELED

    def _get_listener(self) -> TaskListener:
        if self._listener is None:
            self._listener = TaskListener(self._redis)
        return self._listener

    def _keys(self, task_id: str) -> tuple[CapabilityKeys, str]:
        return task_keys(self.settings, task_id)

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
