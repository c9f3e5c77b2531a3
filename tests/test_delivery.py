"""The delivery path end to end: client -> Redis -> dispatcher -> worker process -> result."""

from __future__ import annotations

import asyncio
import gc
import hashlib
import os
import signal
import threading
import time
import weakref
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from broker import AsyncReachClient, ReachClient, TaskFailed
from broker.infra import connection
from broker.keys import CapabilityKeys
from broker.protocol.agents import agent_state_call
from broker.registry import server_ms
from broker.scripts import AsyncScripts, Scripts, source
from broker.settings import Settings
from tests.conftest import Fleet, asyncio_wait_until, sync_redis, wait_until
from tests.handlers import run_order, runs


def test_thousand_tasks_two_workers_each_runs_exactly_once(
    client: ReachClient, fleet: Fleet, r: redis.Redis, prefix: str
) -> None:
    fleet.dispatcher()
    fleet.workers(2, "work", handler="tests.handlers:record", concurrency=8)
    handles = client.submit_many("work", [{"n": i} for i in range(1000)])
    results = [h.result(timeout=60) for h in handles]
    assert results == [{"n": i} for i in range(1000)]
    counts = runs(r, prefix)
    assert len(counts) == 1000 and set(counts.values()) == {1}
    agents = {h.status().agent_id for h in handles}
    assert len(agents) == 2, "both workers should have taken part"
    ck = CapabilityKeys(prefix, "work")
    assert r.zcard(ck.queue) == 0
    for agent in agents:
        assert r.xlen(ck.inbox(agent)) == 0, "finished entries are acknowledged and deleted"


def test_everything_carries_on_when_redis_lost_its_scripts(
    request: pytest.FixtureRequest, client: ReachClient, fleet: Fleet, r: redis.Redis, prefix: str
) -> None:
    # (A restart without persistence forgets scripts; the dispatcher sends a round's dispatch
    # calls as bare EVALSHAs in one pipeline and must load what Redis lacks.)
    # (On Cluster the calls go one by one through redis-py's Script, which loads a missing one;
    # SCRIPT FLUSH goes to every primary.)
    if request.node.callspec.params.get("redis_url") not in ("embedded", "cluster"):
        pytest.skip("SCRIPT FLUSH only on the test session's own Redis and Cluster")
    fleet.dispatcher()
    for _ in range(3):
        fleet.worker("noscript", handler="tests.handlers:record", concurrency=4)
    first = client.submit_many("noscript", [{"n": i} for i in range(300)])
    assert [h.result(timeout=60) for h in first] == [{"n": i} for i in range(300)]
    shas = [hashlib.sha1(source(name).encode()).hexdigest() for name in ("submit", "complete")]

    def loaded() -> list[bool]:
        if not isinstance(r, RedisCluster):
            return list(r.script_exists(*shas))
        return [bool(x) for node in r.get_primaries()
                for x in r.execute_command("SCRIPT EXISTS", *shas, target_nodes=node)]

    assert any(loaded()), "the producer and the workers ran their scripts"
    r.script_flush()
    assert not any(loaded()), "every node forgot the scripts"
    second = client.submit_many("noscript", [{"n": i} for i in range(300, 600)])
    assert [h.result(timeout=60) for h in second] == [{"n": i} for i in range(300, 600)]
    counts = runs(r, prefix)
    assert len(counts) == 600 and set(counts.values()) == {1}


def test_calls_sent_together_keep_their_replies_and_an_exchange_past_its_timeout_closes_its_connection(
    request: pytest.FixtureRequest, settings: Settings, r: redis.Redis, prefix: str
) -> None:
    # (Workers report, and dispatchers dispatch, with several calls in one write: AsyncScripts.
    # run_all. A reply left unread on a reused connection would be handed to the next caller.)
    if request.node.callspec.params.get("redis_url") == "cluster":
        pytest.skip("on Cluster the calls go one by one (AsyncScripts.run_all)")
    stream, waiting = f"{prefix}:together", f"{prefix}:together:never"

    async def scenario() -> None:
        aclient = connection.async_client(settings, socket_timeout=0.5)
        scripts = AsyncScripts(aclient)
        nobody = agent_state_call(settings, "nobody", "", "healthy")  # (replies 0)
        await aclient.xgroup_create(stream, "g", id="0", mkstream=True)
        entry = await aclient.xadd(stream, {"a": "1"})
        replies = await scripts.run_all([nobody, nobody], [
            ("XREADGROUP", "GROUP", "g", "c", "COUNT", 10, "STREAMS", stream, ">"),
            ("XREADGROUP", "GROUP", "missing", "c", "COUNT", 1, "STREAMS", stream, ">"),
        ])
        assert replies[:2] == [0, 0]
        assert replies[2] == [[stream, [(entry, {"a": "1"})]]]  # (as redis-py parses it)
        assert isinstance(replies[3], redis.exceptions.ResponseError) and "NOGROUP" in str(replies[3])

        started = time.monotonic()
        with pytest.raises(redis.exceptions.TimeoutError):
            await scripts.run_all([nobody], [("BLPOP", waiting, 30)])
        assert time.monotonic() - started < 5
        # The connection was closed: its BLPOP waits no more and takes nothing pushed later ...
        await asyncio_wait_until(lambda: "cmd=blpop" not in str(r.execute_command("CLIENT", "LIST")),
                                 message="the abandoned BLPOP to stop waiting")
        await aclient.lpush(waiting, "x")
        assert await aclient.lrange(waiting, 0, -1) == ["x"]
        # ... and the next exchange reads its own replies.
        assert await scripts.run_all([nobody, nobody]) == [0, 0]
        await aclient.aclose()

    asyncio.run(scenario())


def skip_on_cluster(request: pytest.FixtureRequest) -> None:
    """The lean paths (Scripts, AsyncScripts and their kept connections) hand every call to
    redis-py's cluster client on Cluster: what these tests pin down is not used there."""
    if request.node.callspec.params.get("redis_url") == "cluster":
        pytest.skip("on Cluster the calls go through redis-py's own paths")


def lean_scripts(request: pytest.FixtureRequest, settings: Settings) -> tuple[redis.Redis, Scripts]:
    """A client and the Scripts whose lean path the test pins down (skipped on Cluster)."""
    skip_on_cluster(request)
    sync = connection.sync_client(settings)
    return sync, Scripts(sync)


def connection_id(scripts: Scripts) -> int:
    """The id Redis gives the connection the calling thread's next lean call goes on."""
    return int(scripts.command("CLIENT", "ID"))


def test_script_calls_on_pooled_connections_the_server_dropped_succeed_at_once(
    request: pytest.FixtureRequest, settings: Settings, r: redis.Redis
) -> None:
    # (A restart, a failover or a proxy closes the connections a pool holds. The lean paths,
    # AsyncScripts.run_all and Scripts._evalsha, take a pooled connection themselves; a dead
    # one must be replaced, not fail the call: with redis-py 8's maintenance notifications
    # on, the asyncio pool handed it out as it was.)
    skip_on_cluster(request)
    nobody = agent_state_call(settings, "nobody", "", "healthy")  # (replies 0)

    def drop(client_id: int) -> None:
        r.execute_command("CLIENT", "KILL", "ID", client_id)

    sync = connection.sync_client(settings)
    scripts = Scripts(sync)
    assert scripts(nobody) == 0
    drop(connection_id(scripts))  # (the connection this thread keeps)
    assert scripts(nobody) == 0
    sync.close()

    async def scenario() -> None:
        aclient = connection.async_client(settings)
        ascripts = AsyncScripts(aclient)
        idle = aclient.connection_pool._available_connections

        async def drop_idle() -> None:
            drop(await aclient.client_id())
            # (as after a restart: the pool's idle connection has seen the server close it)
            await asyncio_wait_until(lambda: all(c._reader is None or c._reader.at_eof() for c in idle),
                                     message="the pooled connection to see its end")

        assert await ascripts.run_all([nobody, nobody]) == [0, 0]
        await drop_idle()
        assert await ascripts.run_all([nobody, nobody]) == [0, 0]
        await drop_idle()
        assert await ascripts.command("PING") is True
        await aclient.aclose()

    asyncio.run(scenario())


def test_a_thread_keeps_its_connection_gives_it_back_when_it_ends_and_a_fork_takes_its_own(
    request: pytest.FixtureRequest, settings: Settings
) -> None:
    # (The synchronous lean path, Scripts._exchange, keeps one connection per thread instead of
    # a pooled one per call. Threads must not share one, an ended thread must not hold one
    # for ever, and a forked process must never write to its parent's.)
    sync, scripts = lean_scripts(request, settings)
    pool = sync.connection_pool
    mine = connection_id(scripts)
    assert connection_id(scripts) == mine
    theirs: list[Any] = []

    def other() -> None:
        theirs.extend([connection_id(scripts), connection_id(scripts),
                       scripts._kept.kept.conn])

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert theirs[0] == theirs[1] != mine
    gc.collect()
    assert theirs[2] in pool._available_connections  # (given back as its thread ended)
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # (the child: report its connection's id, then leave at once)
        try:
            os.write(write, str(connection_id(scripts)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        forked = int(pipe.read() or 0)
    os.waitpid(child, 0)
    assert forked and forked not in (mine, theirs[0])
    assert connection_id(scripts) == mine  # (the parent's is untouched)
    sync.close()


def test_a_client_dropped_without_close_lets_go_of_the_connections_its_threads_kept(
    request: pytest.FixtureRequest, settings: Settings, r: redis.Redis
) -> None:
    # (A service that makes a client per request and never closes it, on its main thread or
    # on pool threads that live for ever, must not keep a server connection per request: the
    # kept connections go with the client, as redis-py's pooled ones do, not with the threads.)
    skip_on_cluster(request)
    held = [ReachClient(settings)]  # (the only reference: the thread below must not keep one)
    held[0].submit("dropped", {"n": 1})
    ids = [connection_id(held[0]._scripts)]
    release = threading.Event()
    kept_there = threading.Event()

    def long_lived() -> None:
        ids.append(connection_id(held[0]._scripts))
        kept_there.set()
        release.wait(60)

    thread = threading.Thread(target=long_lived)
    thread.start()
    try:
        assert kept_there.wait(10)
        scripts = weakref.ref(held[0]._scripts)
        held.clear()
        gc.collect()
        assert scripts() is None, "something still holds the dropped client's scripts"
        for client_id in ids:
            wait_until(lambda client_id=client_id: not r.execute_command("CLIENT", "LIST", "ID", client_id),
                       message=f"the kept connection {client_id} to close")
    finally:
        release.set()
        thread.join()


def test_a_signal_handler_that_calls_the_client_mid_exchange_uses_a_connection_of_its_own(
    request: pytest.FixtureRequest, settings: Settings
) -> None:
    # (A thread's kept connection is in the middle of an exchange while result() waits on it:
    # a signal handler that calls the client then, say to cancel the task on Ctrl-C, must not
    # write on it, or each would read the other's reply.)
    sync, scripts = lean_scripts(request, settings)
    mine = connection_id(scripts)
    seen: list[Any] = []

    def on_alarm(signum: int, frame: Any) -> None:
        seen.append(connection_id(scripts))

    before = signal.signal(signal.SIGALRM, on_alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        assert scripts.command("BLPOP", f"{settings.prefix}:never", 1) is None  # (waits 1 s)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
    assert len(seen) == 1 and seen[0] != mine
    assert connection_id(scripts) == mine  # (still in step)
    sync.close()
    # Threads keep at most half of a pool's connections: the others take one per call, and
    # the pool never runs dry for them.
    bounded = redis.Redis(connection_pool=redis.BlockingConnectionPool.from_url(
        settings.redis_url, max_connections=2, timeout=1, decode_responses=True))
    limited = Scripts(bounded)
    assert limited.command("PING") == "PONG" and limited._kept_connection() is not None
    kept_elsewhere: list[Any] = []

    def other() -> None:
        kept_elsewhere.extend([limited.command("PING"), limited._kept_connection()])

    for _ in range(3):
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
    assert kept_elsewhere == ["PONG", None] * 3
    spare = bounded.connection_pool.get_connection()  # (one left besides this thread's own)
    bounded.connection_pool.release(spare)
    bounded.close()


def test_a_lane_keeps_its_connection_and_replaces_one_that_failed_or_was_dropped(
    request: pytest.FixtureRequest, settings: Settings, r: redis.Redis
) -> None:
    # (A worker's inbox reader and its reporter each keep a connection of their own, a Lane,
    # instead of a pooled one per exchange. It must behave as the pool would: replies always
    # in step, a connection the server dropped while idle replaced before use, one whose
    # exchange failed half way never used again.)
    skip_on_cluster(request)
    nobody = agent_state_call(settings, "nobody", "", "healthy")  # (replies 0)
    never = f"{settings.prefix}:lane:never"

    async def scenario() -> None:
        aclient = connection.async_client(settings, socket_timeout=0.5)
        lane = AsyncScripts(aclient).lane()
        first = await lane.command("CLIENT", "ID")
        assert await lane.command("CLIENT", "ID") == first  # (kept, not taken from the pool)
        assert await lane.run_all([nobody], [("CLIENT", "ID")]) == [0, first]
        # Dropped by the server while idle (a restart, a proxy): the next exchange goes through.
        r.execute_command("CLIENT", "KILL", "ID", first)
        kept = lane._conn
        await asyncio_wait_until(lambda: kept._reader is None or kept._reader.at_eof(),
                                 message="the lane's connection to see its end")
        second = await lane.command("CLIENT", "ID")
        assert second != first
        # An exchange past its timeout closes the connection, and the next reads its own reply.
        with pytest.raises(redis.exceptions.TimeoutError):
            await lane.command("BLPOP", never, 30)
        third = await lane.command("CLIENT", "ID")
        assert third not in (first, second)
        assert await lane.run_all([nobody, nobody]) == [0, 0]
        # Two exchanges at once on one lane: the second takes a pooled connection.
        blocked = asyncio.ensure_future(lane.command("BLPOP", never, 0.2))
        await asyncio_wait_until(lambda: lane.busy, message="the first exchange on the lane")
        assert await lane.command("CLIENT", "ID") not in (first, second, third)
        assert await blocked is None
        assert await lane.command("CLIENT", "ID") == third
        await lane.close()
        await aclient.aclose()

    asyncio.run(scenario())


def test_priority_order_with_one_worker_of_concurrency_one(
    client: ReachClient, fleet: Fleet, r: redis.Redis, prefix: str
) -> None:
    priorities = [3, 9, 0, 5, 7, 1, 8, 2, 6, 4, 9, 0]
    handles = [client.submit("prio", {"n": i}, priority=p) for i, p in enumerate(priorities)]
    fleet.worker("prio", handler="tests.handlers:record_order", concurrency=1)
    fleet.dispatcher()
    for h in handles:
        h.result(timeout=30)
    order = [handles[int(n)] for n in run_order(r, prefix)]
    started_priorities = [h.status().priority for h in order]
    assert started_priorities == sorted(priorities, reverse=True)
    # Equal priorities run first-in first-out.
    nines = [h.task_id for h in order if h.status().priority == 9]
    assert nines == [handles[1].task_id, handles[10].task_id]


def test_aging_lets_an_old_low_priority_task_overtake_newer_high_priority_ones(
    make_settings: object, fleet: Fleet
) -> None:
    settings = make_settings(aging_ms=40)  # type: ignore[operator]
    with ReachClient(settings) as client:
        old = client.submit("aging", {"n": "old"}, priority=0)
        # Waiting 9 levels' worth of aging (9 x 40 ms) and then some, on the Redis server
        # clock that scores the queue: the old task now ranks above a fresh priority-9 task.
        created = client.status(old.task_id).created_at
        assert created is not None
        r = sync_redis(settings.redis_url)
        wait_until(lambda: server_ms(r.time()) >= created.timestamp() * 1000 + 9 * 40 + 100,
                   message="9 levels of aging on the server clock")
        newer = [client.submit("aging", {"n": f"new{i}"}, priority=9) for i in range(5)]
        fleet.worker("aging", handler="tests.handlers:record_order", concurrency=1, settings=settings)
        fleet.dispatcher(settings=settings)
        for h in [old, *newer]:
            h.result(timeout=30)
        assert run_order(sync_redis(settings.redis_url), settings.prefix)[0] == "old"


def test_without_aging_high_priority_runs_first(client: ReachClient, fleet: Fleet, r: redis.Redis,
                                                prefix: str) -> None:
    old = client.submit("noaging", {"n": "old"}, priority=0)
    newer = [client.submit("noaging", {"n": f"new{i}"}, priority=9) for i in range(3)]
    fleet.worker("noaging", handler="tests.handlers:record_order", concurrency=1)
    fleet.dispatcher()
    for h in [old, *newer]:
        h.result(timeout=30)
    assert run_order(r, prefix) == ["new0", "new1", "new2", "old"]


@pytest.mark.parametrize("handler", ["progress_steps", "progress_steps_sync"])
def test_events_arrive_in_order_with_progress_before_the_result(
    client: ReachClient, fleet: Fleet, handler: str
) -> None:
    fleet.dispatcher()
    fleet.worker("steps", handler=f"tests.handlers:{handler}")
    handle = client.submit("steps", {"steps": 3})
    events = list(handle.events(timeout=30))
    types = [e.type for e in events]
    assert types == ["queued", "dispatched", "accepted", "progress", "progress", "progress",
                     "succeeded"]
    assert [e.seq for e in events] == list(range(1, 8))
    assert [e.data["fraction"] for e in events if e.type == "progress"] == pytest.approx([1 / 3, 2 / 3, 1])
    assert all(e.task_id == handle.task_id and e.trace_id for e in events)
    assert events[-1].attempt == 1 and events[-1].agent_id
    times = [e.time for e in events]
    assert times == sorted(times)
    assert handle.result(timeout=5) == {"done": True}
    # Replaying after the end gives the same history.
    assert [e.type for e in handle.events()] == types


def test_a_start_is_recorded_once_the_task_has_run_a_while_and_dated_when_it_began(
    client: ReachClient, fleet: Fleet, r: redis.Redis, prefix: str
) -> None:
    """A worker records a start only for a task still running START_RECORD_S after it began
    (a shorter one is started by its completion), dated when it began, not when recorded."""
    fleet.dispatcher()
    fleet.worker("stamped", handler="tests.handlers:stamps_start")
    long, short = client.submit("stamped", {"s": 2.0}), client.submit("stamped", {"s": 0.01})
    record = CapabilityKeys(prefix, "stamped").task

    def began(task_id: str) -> int:
        return int(wait_until(lambda: r.get(f"{prefix}:test:start:{task_id}"), 30,
                              message=f"{task_id} started"))

    def recorded(task_id: str, state: str) -> int:
        local = task_id.split(":", 1)[1]
        wait_until(lambda: r.hget(record(local), "state") == state, 30, message=f"{task_id} {state}")
        return int(r.hget(record(local), "started_at") or 0)

    for handle, state in ((long, "running"), (short, "succeeded")):
        start = began(handle.task_id)
        assert abs(recorded(handle.task_id, state) - start) <= 60  # (one host's clocks; undated: 100)
        assert [e.type for e in handle.events(timeout=30)].count("accepted") == 1
    assert long.result(timeout=30) == {"slept": 2.0}


def test_sync_and_async_handlers_both_work(client: ReachClient, fleet: Fleet) -> None:
    fleet.dispatcher()
    fleet.worker("a", handler="tests.handlers:record")
    fleet.worker("s", handler="tests.handlers:record_sync")
    assert client.run("a", {"n": 1}, timeout=30) == {"n": 1}
    assert client.run("s", {"n": 2}, timeout=30) == {"n": 2, "sync": True}


def test_builtin_summarize_agent(client: ReachClient, fleet: Fleet) -> None:
    fleet.dispatcher()
    fleet.worker("summarize")
    text = ("Redis streams keep entries in order. Consumer groups share work between readers. "
            "Each entry is delivered to one consumer. Pending entries can be claimed by others "
            "when a reader dies. Weather was nice yesterday.")
    result = client.run("summarize", {"text": text, "max_sentences": 2}, timeout=30)
    assert len(result["sentences"]) == 2
    assert result["sentence_count"] == 5
    assert result["summary"] == " ".join(result["sentences"])
    with pytest.raises(TaskFailed) as failed:
        client.run("summarize", {"text": ""}, timeout=30)
    assert failed.value.reason == "invalid_request"


def test_result_timeout_leaves_the_task_running(client: ReachClient, fleet: Fleet) -> None:
    handle = client.submit("later", {"n": 1})
    with pytest.raises(TimeoutError):
        handle.result(timeout=0.3)
    assert handle.status().state == "queued"
    fleet.dispatcher()
    fleet.worker("later", handler="tests.handlers:record")
    assert handle.result(timeout=30) == {"n": 1}


async def test_async_client_mirrors_the_sync_one(settings: object, fleet: Fleet) -> None:
    fleet.dispatcher()
    fleet.worker("steps", handler="tests.handlers:progress_steps")
    async with AsyncReachClient(settings) as client:  # type: ignore[arg-type]
        handle = await client.submit("steps", {"steps": 2}, priority=7)
        types = [e.type async for e in handle.events(timeout=30)]
        assert types[-1] == "succeeded" and types.count("progress") == 2
        assert await handle.result(timeout=5) == {"done": True}
        many = await client.submit_many("steps", [{"steps": 1}] * 50)
        results = await asyncio.gather(*(h.result(timeout=30) for h in many))
        assert results == [{"done": True}] * 50
        assert (await client.get(handle.task_id)).task_id == handle.task_id
        assert (await handle.status()).state == "succeeded"
        assert await client.run("steps", {"steps": 1}, timeout=30) == {"done": True}


def test_idempotency_key_returns_the_first_task(client: ReachClient, fleet: Fleet) -> None:
    first = client.submit("idem", {"n": 1}, idempotency_key="order-42")
    second = client.submit("idem", {"n": 2}, idempotency_key="order-42")
    assert second.task_id == first.task_id and not second.created and first.created
    assert client.queue_depth("idem") == 1
    fleet.dispatcher()
    fleet.worker("idem", handler="tests.handlers:record")
    assert second.result(timeout=30) == {"n": 1}


def test_cancel_a_queued_task(client: ReachClient, fleet: Fleet) -> None:
    handle = client.submit("cancel", {"n": 1})
    assert client.cancel(handle.task_id) is True
    assert client.cancel(handle.task_id) is False
    assert handle.status().state == "canceled"
    assert client.queue_depth("cancel") == 0
    from broker import TaskCanceled

    with pytest.raises(TaskCanceled):
        handle.result(timeout=5)
    assert [e.type for e in handle.events(timeout=5)] == ["queued", "canceled"]


def test_workers_dispatchers_and_clients_reconnect_after_a_redis_restart(tmp_path: object) -> None:
    import secrets
    from pathlib import Path

    from broker import Settings
    from broker.infra.embedded import EmbeddedRedis
    from tests.conftest import FAST

    server = EmbeddedRedis(appendonly=True).start()
    try:
        settings = Settings.load(redis_url=server.url, prefix=f"rs{secrets.token_hex(3)}", **FAST)
        fleet = Fleet(settings, Path(str(tmp_path)))
        try:
            fleet.dispatcher()
            fleet.worker("echo")
            with ReachClient(settings) as client:
                assert client.run("echo", {"before": 1}, timeout=30) == {"before": 1}
                queued = client.submit("echo", {"queued": 1})  # may or may not run before the kill
                server.kill()
                server.start()  # same port; the AOF brings every acknowledged write back
                assert queued.result(timeout=60) == {"queued": 1}
                assert client.run("echo", {"after": 1}, timeout=60) == {"after": 1}
            assert all(p.popen.poll() is None for p in fleet.procs), "nobody crashed"
        finally:
            fleet.stop_all()
    finally:
        server.stop()


def test_processes_warn_at_start_when_redis_may_evict_tasks(tmp_path: object) -> None:
    import secrets
    from pathlib import Path

    from broker import Settings
    from broker.infra.embedded import EmbeddedRedis
    from tests.conftest import FAST

    server = EmbeddedRedis(extra_args=["--maxmemory-policy", "allkeys-lru"]).start()
    try:
        settings = Settings.load(redis_url=server.url, prefix=f"ev{secrets.token_hex(3)}", **FAST)
        fleet = Fleet(settings, Path(str(tmp_path)))
        try:
            dispatcher = fleet.dispatcher()
            worker = fleet.worker("echo")
            for proc in (dispatcher, worker):
                wait_until(lambda proc=proc: "maxmemory-policy is 'allkeys-lru'" in proc.output(),
                           message=f"{proc.name} warns about eviction")
        finally:
            fleet.stop_all()
    finally:
        server.stop()
