"""Waiting for a result on the asyncio client and the gateway's long-poll: the outcome rides on
the task's channel as the task ends (`done|<outcome>`, lua/_finish.lua), so a waiter reads the
record once, when it registers, and not again after the wake-up; an outcome-only wait has no
event published for it. Real worker and dispatcher processes; the reads are counted with
MONITOR."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import redis

from broker import AsyncReachClient, TaskFailed
from broker.infra.connection import sync_client
from broker.keys import CapabilityKeys, Channels
from broker.settings import Settings
from tests.conftest import Fleet, asyncio_wait_until, wait_until
from tests.gateway_helpers import start_gateway

pytestmark = pytest.mark.one_redis


class Reads:
    """The commands Redis runs, as MONITOR sees them (from a thread)."""

    def __init__(self, settings: Settings) -> None:
        self.commands: list[str] = []
        self.settings = settings
        self._conn = sync_client(settings)
        self._monitor = self._conn.monitor()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Reads:
        self._monitor.__enter__()
        self._thread.start()
        return self

    def _run(self) -> None:
        with contextlib.suppress(redis.ConnectionError, OSError, ValueError):  # (closed: the end)
            for line in self._monitor.listen():
                self.commands.append(str(line.get("command", "")))

    def watches(self, task_key: str) -> list[str]:
        """The watch.lua runs on the task so far (its first command: MONITOR shows a script's
        own commands once per run, the EVALSHA line itself maybe more than once)."""
        marker = f"reads-so-far-{uuid.uuid4().hex}"
        r = sync_client(self.settings)
        r.echo(marker)  # (MONITOR keeps Redis's order: every earlier command is in before it)
        r.close()
        wait_until(lambda: f"ECHO {marker}" in self.commands, message="MONITOR to catch up")
        return [c for c in self.commands if c == f"HMGET {task_key} state w trace seq id progress_dropped"]

    def __exit__(self, *exc: object) -> None:
        self._conn.close()  # (ends the listen loop with an error in its thread)


@pytest.fixture
def channel_messages(settings: Settings) -> Iterator[Any]:
    conn = sync_client(settings)
    pubsub = conn.pubsub(ignore_subscribe_messages=True)
    yield pubsub
    pubsub.close()
    conn.close()


def drain(pubsub: Any, until: str, timeout: float = 10.0) -> list[str]:
    """Messages of the subscribed channels until one starting with `until` (with a deadline)."""
    got: list[str] = []

    def more() -> bool:
        message = pubsub.get_message(timeout=0.1)
        if message is not None:
            got.append(message["data"] if isinstance(message["data"], str) else message["data"].decode())
        return any(m.startswith(until) for m in got)

    wait_until(more, timeout, message=f"a message starting {until!r}")
    return got


async def test_an_async_result_wait_takes_the_outcome_from_the_channel(
        settings: Settings, fleet: Fleet, channel_messages: Any) -> None:
    fleet.dispatcher()
    async with AsyncReachClient(settings) as client:
        handle = await client.submit("rwait", {"sleep": 0.3, "n": 1})
        task_key = CapabilityKeys(settings.prefix, "rwait").task(handle.task_id.split(":")[1])
        channel_messages.subscribe(Channels(settings.prefix).task(handle.task_id))
        with Reads(settings) as reads:
            waiter = asyncio.create_task(handle.result(timeout=30))
            r = sync_client(settings)
            await asyncio_wait_until(lambda: r.hget(task_key, "w") == "o", message="the wait to register")
            fleet.worker("rwait", handler="tests.gateway_handlers:work")
            assert await waiter == {"sleep": 0.3, "n": 1}
            # Registered once; the end itself carried the result, so no read after the wake-up.
            assert len(reads.watches(task_key)) == 1, reads.watches(task_key)
        # An outcome-only wait has none of the task's events published: only its outcome.
        messages = await asyncio.to_thread(drain, channel_messages, "done|")
        assert messages == ['done|{"state":"succeeded","result":{"sleep":0.3,"n":1}}']
        r.close()


async def test_failures_and_results_too_large_to_ride_along_are_read_from_the_record(
        settings: Settings, fleet: Fleet) -> None:
    fleet.dispatcher()
    big = {"blob": "x" * 20_000}  # (over the 8 KiB an outcome carries along)
    keys = CapabilityKeys(settings.prefix, "rwait2")
    async with AsyncReachClient(settings) as client:
        failing = await client.submit("rwait2", {"invalid": "no thanks"})
        large = await client.submit("rwait2", big)
        with Reads(settings) as reads:
            waits = [asyncio.create_task(h.result(timeout=30)) for h in (failing, large)]
            r = sync_client(settings)
            await asyncio_wait_until(lambda: all(r.hget(keys.task(h.task_id.split(":")[1]), "w") == "o"
                                                 for h in (failing, large)), message="both to wait")
            r.close()
            fleet.worker("rwait2", handler="tests.gateway_handlers:work")
            with pytest.raises(TaskFailed) as failed:
                await waits[0]
            assert failed.value.reason == "invalid_request" and "no thanks" in str(failed.value.error)
            assert await waits[1] == big
            assert len(reads.watches(keys.task(failing.task_id.split(":")[1]))) == 1
            assert len(reads.watches(keys.task(large.task_id.split(":")[1]))) == 2  # (and the read)


async def test_an_events_follower_and_a_result_wait_on_one_task_both_get_theirs(
        settings: Settings, fleet: Fleet, channel_messages: Any) -> None:
    fleet.dispatcher()
    async with AsyncReachClient(settings) as client:
        handle = await client.submit("rwait3", {"steps": 2, "step_ms": 50, "sleep": 0.2})
        task_key = CapabilityKeys(settings.prefix, "rwait3").task(handle.task_id.split(":")[1])
        channel_messages.subscribe(Channels(settings.prefix).task(handle.task_id))
        result = asyncio.create_task(handle.result(timeout=30))
        r = sync_client(settings)
        await asyncio_wait_until(lambda: r.hget(task_key, "w") == "o", message="the result wait to register")
        types: list[str] = []

        async def follow() -> None:
            async for event in handle.events(timeout=30):
                types.append(event.type)

        follower = asyncio.create_task(follow())
        # The follower's registration turns the outcome-only flag into a full one.
        await asyncio_wait_until(lambda: r.hget(task_key, "w") == "1", message="the follower to register")
        fleet.worker("rwait3", handler="tests.gateway_handlers:work")
        assert await result == {"steps": 2, "step_ms": 50, "sleep": 0.2}
        await follower
        assert types[-1] == "succeeded" and types.count("progress") == 2
        messages = await asyncio.to_thread(drain, channel_messages, "done|")
        published = [m.split("|")[1] for m in messages[:-1]]
        assert "progress" in published and published[-1] == "succeeded"
        assert json.loads(messages[-1][len("done|"):])["state"] == "succeeded"
        r.close()


def test_the_gateways_long_poll_answers_from_the_outcome_its_task_published(
        settings: Settings, fleet: Fleet) -> None:
    fleet.dispatcher()
    _, base = start_gateway(fleet)
    keys = CapabilityKeys(settings.prefix, "rwait4")
    r = sync_client(settings)
    with httpx.Client(base_url=base, timeout=30) as http, Reads(settings) as reads:
        ok, bad = (http.post("/v1/tasks", json={"capability": "rwait4", "payload": p}).json()["task_id"]
                   for p in ({"sleep": 0.2}, {"invalid": "nope"}))
        with ThreadPoolExecutor(2) as pool:
            polls = [pool.submit(http.get, f"/v1/tasks/{t}/result", params={"wait": 20}) for t in (ok, bad)]
            wait_until(lambda: all(r.hget(keys.task(t.split(":")[1]), "w") == "o" for t in (ok, bad)),
                       message="both long-polls to wait")
            fleet.worker("rwait4", handler="tests.gateway_handlers:work")
            answers = [p.result(timeout=30).json() for p in polls]
        assert answers[0] == {"task_id": ok, "state": "succeeded", "result": {"sleep": 0.2}}
        assert answers[1]["state"] == "failed" and answers[1]["reason"] == "invalid_request"
        assert answers[1]["error"] == "InvalidRequest: nope"
        for t in (ok, bad):  # (read once as each poll came in; the answer came with the end)
            assert len(reads.watches(keys.task(t.split(":")[1]))) == 1
    r.close()
