"""Issue 3: the agent registry (registration, tokens, heartbeats, the operators' view), against
real Redis and real processes (health states, draining and pruning: test_agent_lifecycle.py).

Every worker is a real `python -m reach_cli.worker` process and every dispatcher a real
`python -m reach_cli dispatcher`; health is driven with real signals (SIGSTOP/SIGCONT/SIGTERM/
SIGKILL) and judged, as the product does, from the Redis server clock. The state a test relies on
(what sits in an inbox, what the registry recorded) is read from Redis and polled with a
deadline, never assumed after a sleep.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis

from agent_worker.registration import register
from broker import ReachClient
from broker.client.events import feed_events
from broker.errors import RegistrationRefused
from broker.ids import split_task_id
from broker.infra import connection
from broker.infra.embedded import EmbeddedRedis, free_port
from broker.keys import CapabilityKeys, RegistryKeys
from broker.models import AgentDescriptor
from broker.protocol.agents import deregister_call, heartbeat_call
from broker.protocol.delivery import Lease, accept_call
from broker.protocol.reports import Completion, complete_call, progress_call, renew_call
from broker.registry import AgentState
from broker.scripts import AsyncScripts, Scripts
from broker.settings import Settings
from tests.conftest import FAST, Fleet, agent_state_of, settings_env, wait_until
from tests.registry_reads import (
    MakeSettings,
    agent_hash,
    agent_stats,
    alive,
    first_event,
    holds_one_running_one_unread,
    inbox_entries,
    inbox_load,
    now_ms,
    reach_json,
    registry_events,
    state_changes,
    task_events,
    task_record,
)

SKEW_DIR = Path(__file__).resolve().parent / "skew"
AGENT_FIELDS = ["agent_id", "state", "capabilities", "region", "version", "inflight",
                "max_concurrency", "last_heartbeat_age_s", "backlog"]
QUEUE_FIELDS = ["capability", "queued", "delayed", "unread_in_inboxes", "running",
                "oldest_queued_age_s", "agents", "healthy_agents"]

# -- tokens -----------------------------------------------------------------------------------


def test_a_forged_heartbeat_or_deregister_with_a_wrong_token_is_refused(
    settings: Settings, fleet: Fleet, r: redis.Redis, prefix: str
) -> None:
    w = fleet.worker("forge", handler="tests.handlers:record")
    assert w.agent_id
    scripts = Scripts(r)
    forged_stats = {"inflight": 99, "loop_progress_age_ms": 0, "draining": True}
    for token in ("not-the-token", ""):
        reply = scripts(heartbeat_call(settings, w.agent_id, token, forged_stats, "draining"))
        assert reply == ["refused"]
    assert scripts(deregister_call(settings, w.agent_id, "not-the-token")) == "refused"
    assert scripts(heartbeat_call(settings, "nobody", "x", {}, "")) == ["unknown"]

    record = agent_hash(r, prefix, w.agent_id)
    assert record["mode"] == "active" and int(record["refused"]) == 3
    assert json.loads(record["stats"]).get("inflight") != 99
    assert agent_state_of(settings, w.agent_id) is AgentState.HEALTHY
    refused = [e["detail"] for e in registry_events(r, prefix, w.agent_id)
               if e["type"] == "token_refused"]
    assert refused == ["heartbeat", "heartbeat", "deregister"]
    # The agent's own beats still count.
    before = int(agent_hash(r, prefix, w.agent_id)["last_seen"])
    wait_until(lambda: int(agent_hash(r, prefix, w.agent_id or "")["last_seen"]) > before,
               message="the real heartbeat still accepted")
    rows = {row["agent_id"]: row for row in reach_json(settings, "agents")}
    assert rows[w.agent_id]["state"] == "healthy"
    alive(w)


def test_forged_accept_complete_progress_renew_with_a_wrong_token_are_refused(
    settings: Settings, fleet: Fleet, r: redis.Redis, prefix: str, client: ReachClient
) -> None:
    w = fleet.worker("fence", handler="tests.handlers:sleepy", concurrency=1)
    assert w.agent_id
    running = client.submit("fence", {"s": 3, "n": "running"}, priority=9)
    waiting = client.submit("fence", {"s": 0.1, "n": "waiting"}, priority=1)
    fleet.dispatcher()
    wait_until(lambda: holds_one_running_one_unread(r, prefix, "fence", w, running),
               message="one running and one unread task in the agent's inbox")
    entries = inbox_entries(r, prefix, "fence", w.agent_id)
    run_local, wait_local = split_task_id(running.task_id)[1], split_task_id(waiting.task_id)[1]
    run_entry, run_fence = entries[run_local]
    wait_entry, wait_fence = entries[wait_local]
    before = {h.task_id: (task_record(r, prefix, h.task_id), task_events(r, prefix, h.task_id))
              for h in (running, waiting)}

    scripts = Scripts(r)
    bad = "forged-token"
    accept = accept_call(settings, "fence", w.agent_id, bad,
                                  [Lease(wait_entry, wait_local, wait_fence)])
    assert scripts(accept) == ["refused"]
    complete = complete_call(settings, "fence", w.agent_id, bad, [Completion(
        run_entry, run_local, run_fence, "success", '{"forged": true}', 0, 1)])
    assert scripts(complete) == ["refused"]
    assert scripts(progress_call(settings, "fence", run_local, w.agent_id, bad, run_fence,
                                          '{"fraction":1.0}')) == "refused"
    assert scripts(renew_call(settings, "fence", w.agent_id, bad, [
        Lease(run_entry, run_local, run_fence)])) == ["refused"]
    # An empty token is no token at all.
    complete_empty = complete_call(settings, "fence", w.agent_id, "", [Completion(
        run_entry, run_local, run_fence, "failure", "forged", 0, 1)])
    assert scripts(complete_empty) == ["refused"]

    # Nothing moved: same records, same histories, same inbox.
    for h in (running, waiting):
        assert (task_record(r, prefix, h.task_id), task_events(r, prefix, h.task_id)) == before[h.task_id]
    assert inbox_load(r, prefix, "fence", w.agent_id) == (2, 1)
    ck = CapabilityKeys(prefix, "fence")
    assert r.hget(ck.tokens, f"refused:{w.agent_id}") == "5"
    feed = [e for _, fields in r.xrange(ck.events) for e in feed_events(fields)]
    calls = [e["data"]["call"] for e in feed if e["type"] == "token_refused"]
    assert sorted(calls) == ["accept", "complete", "complete", "progress"]
    assert all(e["agent_id"] == w.agent_id for e in feed if e["type"] == "token_refused")
    # The real agent, with the real token, is not disturbed.
    assert running.result(timeout=30) == {"slept": 3, "attempt": 1}
    assert waiting.result(timeout=30) == {"slept": 0.1, "attempt": 1}
    rows = {row["agent_id"]: row for row in reach_json(settings, "agents")}
    assert rows[w.agent_id]["refused_tokens"] == 5


def test_registration_is_an_idempotent_upsert_and_replaces_the_token(
    settings: Settings, make_settings: MakeSettings, fleet: Fleet, r: redis.Redis, prefix: str,
    client: ReachClient
) -> None:
    descriptor = AgentDescriptor(agent_id="reg-1", capabilities=["reg"], max_concurrency=2)

    async def register_twice() -> tuple[str, str, bool, bool]:
        aclient = connection.async_client(settings)
        scripts = AsyncScripts(aclient)
        try:
            first = await register(settings, aclient, scripts, descriptor)
            beat_first = await scripts(heartbeat_call(settings, "reg-1", first, {}))
            # (The id is live: only the holder of its token may register it again, issue 28.)
            with pytest.raises(RegistrationRefused):
                await register(settings, aclient, scripts, descriptor)
            second = await register(settings, aclient, scripts, descriptor, held_token=first)
            beat_old = await scripts(heartbeat_call(settings, "reg-1", first, {}))
            return first, second, beat_first[0] == "ok", beat_old == ["refused"]
        finally:
            await aclient.aclose()

    first, second, first_was_good, old_refused = asyncio.run(register_twice())
    assert first != second and first_was_good and old_refused
    scripts = Scripts(r)
    assert scripts(heartbeat_call(settings, "reg-1", second, {}))[0] == "ok"
    # The capability's token hash was replaced too: the old token cannot accept or complete.
    assert scripts(accept_call(settings, "reg", "reg-1", first, [])) == ["refused"]
    assert scripts(accept_call(settings, "reg", "reg-1", second, [])) == []
    assert r.zrange(RegistryKeys(prefix).agents, 0, -1) == ["reg-1"]
    details = [e["detail"] for e in registry_events(r, prefix, "reg-1") if e["type"] == "registered"]
    assert details == ["", "re-registered"]

    # A real worker restarted under the same id, once the old one is offline, takes over the
    # same record and serves tasks.
    fast = make_settings(heartbeat_ms=200, suspect_after_ms=500, offline_after_ms=1000)
    fleet.dispatcher(settings=fast)
    old = fleet.worker("same", handler="tests.handlers:record", agent_id="same-1", settings=fast)
    old.kill()
    wait_until(lambda: agent_state_of(fast, "same-1") is AgentState.OFFLINE, message="offline")
    new = fleet.worker("same", handler="tests.handlers:record", agent_id="same-1", settings=fast)
    assert client.run("same", {"n": 7}, timeout=30) == {"n": 7}
    assert client.submit("same", {"n": 8}).result(timeout=30) == {"n": 8}
    assert sorted(r.zrange(RegistryKeys(prefix).agents, 0, -1)) == ["reg-1", "same-1"]
    details = [e["detail"] for e in registry_events(r, prefix, "same-1") if e["type"] == "registered"]
    assert details == ["", "re-registered"]
    assert json.loads(agent_hash(r, prefix, "same-1")["descriptor"])["pid"] == new.popen.pid


# -- heartbeats -------------------------------------------------------------------------------


def test_the_first_heartbeat_goes_out_right_after_registering(
    make_settings: MakeSettings, fleet: Fleet, r: redis.Redis, prefix: str
) -> None:
    # With a one-minute interval, only the initial beat can fill the stats within seconds.
    settings = make_settings(heartbeat_ms=60_000, suspect_after_ms=120_000, offline_after_ms=240_000)
    w = fleet.worker("first", handler="tests.handlers:record", settings=settings, wait=False)
    assert w.agent_id
    wait_until(lambda: agent_hash(r, prefix, w.agent_id or "").get("registered_at"), timeout=20,
               message="the agent registered")
    stats = wait_until(lambda: agent_stats(r, prefix, w.agent_id or "").get("inflight") is not None
                       and agent_stats(r, prefix, w.agent_id or ""), timeout=5,
                       message="the initial heartbeat's stats")
    assert stats["inflight"] == 0 and stats["max_concurrency"] == 4
    record = agent_hash(r, prefix, w.agent_id)
    assert int(record["last_seen"]) >= int(record["registered_at"])
    assert int(record["last_seen"]) - int(record["registered_at"]) < 5000


def test_heartbeats_come_every_interval_and_report_execution_only_latency_and_stability(
    settings: Settings, fleet: Fleet, r: redis.Redis, prefix: str, client: ReachClient
) -> None:
    w = fleet.worker("beat", handler="tests.handlers:sleepy", concurrency=1)
    assert w.agent_id
    # One slow task, then two quick ones that wait about a second (queue + inbox) before they
    # run: measured end to end they would take over a second, executed only 50 ms.
    slow = client.submit("beat", {"s": 1.0, "n": "slow"}, priority=9)
    quick = [client.submit("beat", {"s": 0.05, "n": f"quick{i}"}, priority=1) for i in range(2)]
    fleet.dispatcher()
    for h in (slow, *quick):
        h.result(timeout=30)
    for h in quick:
        record = task_record(r, prefix, h.task_id)
        assert int(record["started_at"]) - int(record["created_at"]) >= 900, "the premise: it waited"
    stats = wait_until(
        lambda: (s := agent_stats(r, prefix, w.agent_id or "")).get("latency_p50_ms") is not None
        and s["latency_p50_ms"] < 1000 and s,
        timeout=5, message="a median latency that leaves out the time spent waiting")
    assert 40 <= stats["latency_p50_ms"] < 500, "latency must be execution time only"
    assert stats["failed"] == 0
    assert 0 <= stats["stability"] <= 1
    for name in ("inflight", "loop_progress_age_ms", "loop_lag_ms", "max_concurrency"):
        assert isinstance(stats[name], int | float), name

    # Cadence: consecutive beats (server time of each) come about every heartbeat_ms.
    seen: list[int] = []

    def seven_beats() -> bool:
        last_seen = int(agent_hash(r, prefix, w.agent_id or "")["last_seen"])
        if not seen or last_seen != seen[-1]:
            seen.append(last_seen)
        return len(seen) >= 7

    wait_until(seven_beats, timeout=10, interval=0.01, message="seven heartbeats")
    gaps = sorted(b - a for a, b in itertools.pairwise(seen[1:]))
    assert settings.heartbeat_ms * 0.5 <= gaps[len(gaps) // 2] <= settings.heartbeat_ms * 2.5, gaps
    assert max(gaps) < settings.suspect_after_ms


def test_every_heartbeat_carries_the_current_inflight_count_and_loop_progress(
    settings: Settings, fleet: Fleet, r: redis.Redis, prefix: str, client: ReachClient
) -> None:
    fleet.dispatcher()
    w = fleet.worker("carry", handler="tests.handlers:sleepy", concurrency=2)
    assert w.agent_id
    handle = client.submit("carry", {"s": 4, "n": "busy"})
    wait_until(lambda: handle.status().state == "running", message="the task running")
    accepted_at = first_event(task_events(r, prefix, handle.task_id), "accepted")["time"]
    samples: list[tuple[int, dict[str, Any]]] = []

    def five_beats_while_busy() -> bool:
        last_seen, stats = r.hmget(RegistryKeys(prefix).agent(w.agent_id or ""), "last_seen", "stats")
        beat = int(last_seen or 0)
        # Beats that began well after the task started (stats are taken as a beat begins).
        if beat > accepted_at + settings.heartbeat_ms and (not samples or samples[-1][0] != beat):
            samples.append((beat, json.loads(stats or "{}")))
        return len(samples) >= 5

    wait_until(five_beats_while_busy, timeout=5, interval=0.01, message="five beats during the task")
    assert handle.status().state == "running", "the task ran throughout"
    for beat, stats in samples:
        assert stats.get("inflight") == 1, (beat, stats)
        assert 0 <= stats["loop_progress_age_ms"] < settings.stall_after_ms, (beat, stats)


def test_clock_skew_on_the_worker_host_changes_nothing(
    settings: Settings, fleet: Fleet, r: redis.Redis, prefix: str, client: ReachClient
) -> None:
    fleet.dispatcher()
    skews = {"ahead": 3600.0, "behind": -3600.0}
    workers = {}
    for name, skew in skews.items():
        pythonpath = os.pathsep.join([str(SKEW_DIR), settings_env(settings)["PYTHONPATH"]])
        workers[name] = fleet.worker(f"skew-{name}", handler="tests.registry_handlers:clock",
                                     concurrency=2, wait=False,
                                     env={"PYTHONPATH": pythonpath, "TEST_CLOCK_SKEW_S": str(skew)})
    for w in workers.values():
        assert w.agent_id
        fleet.wait_healthy(w.agent_id, settings, w)
    # Each task outlives a lease (renewed twice) and the suspect threshold.
    handles = {name: client.submit(f"skew-{name}", {"s": 4}) for name in skews}
    states: set[AgentState | None] = set()

    def done() -> bool:
        for w in workers.values():
            states.add(agent_state_of(settings, w.agent_id or ""))
        return all(h.status().state == "succeeded" for h in handles.values())

    wait_until(done, timeout=30, interval=0.05, message="both tasks done")
    assert states == {AgentState.HEALTHY}, states
    real_now = time.time()
    for name, skew in skews.items():
        result = handles[name].result(timeout=5)
        assert abs(result["time"] - (real_now + skew)) < 60, "the worker's clock was not skewed"
        assert result["attempt"] == 1
        types = [e["type"] for e in task_events(r, prefix, handles[name].task_id)]
        assert types == ["queued", "dispatched", "accepted", "succeeded"]
        w = workers[name]
        assert abs(now_ms(r) - int(agent_hash(r, prefix, w.agent_id or "")["last_seen"])) < 1500
        assert state_changes(r, prefix, w.agent_id or "") == ["new -> healthy"]
        alive(w)


# -- operators' view --------------------------------------------------------------------------


def test_reach_agents_and_queues_json_list_every_agent_and_queue_depth(
    make_settings: MakeSettings, fleet: Fleet, r: redis.Redis, prefix: str
) -> None:
    # A retry that waits a minute in `delayed`; a killed agent offline after 1.5 s (not 3 s:
    # still over seven missed heartbeats).
    settings = make_settings(backoff_base_ms=60_000, backoff_max_ms=60_000, backoff_jitter_ms=0,
                             suspect_after_ms=1000, offline_after_ms=1500)
    busy = fleet.worker("lst", handler="tests.handlers:sleepy", concurrency=1, settings=settings,
                        wait=False, extra_args=["--region", "eu-1", "--version", "2.3.0"])
    gone = fleet.worker("rty", handler="tests.handlers:always_retryable", concurrency=1,
                        settings=settings, wait=False)
    assert busy.agent_id and gone.agent_id
    for w in (busy, gone):
        fleet.wait_healthy(w.agent_id or "", settings, w)
    client = ReachClient(settings)  # (open for the whole test: its handles use it)
    lst = [client.submit("lst", {"s": 30, "n": f"l{i}"}, priority=9 - i) for i in range(3)]
    rty = client.submit("rty", {"n": "r"})
    fleet.dispatcher(settings=settings)
    ck_rty = CapabilityKeys(prefix, "rty")
    wait_until(lambda: holds_one_running_one_unread(r, prefix, "lst", busy, lst[0]),
               message="one running and one unread lst task")
    wait_until(lambda: r.zcard(ck_rty.delayed) == 1, message="the rty task waiting for its retry")
    assert lst[2].status().state == "queued" and rty.status().state == "retrying"
    gone.kill()
    wait_until(lambda: agent_state_of(settings, gone.agent_id or "") is AgentState.OFFLINE,
               timeout=10, message="the killed agent offline")

    # (The three commands only read: they run at once, and are checked as before.)
    with ThreadPoolExecutor(3) as pool:
        listed = pool.submit(reach_json, settings, "agents")
        listed_rty = pool.submit(reach_json, settings, "agents", "--capability", "rty")
        listed_queues = pool.submit(reach_json, settings, "queues")
        agents, only, queues = listed.result(), listed_rty.result(), listed_queues.result()
    assert isinstance(agents, list) and len(agents) == 2
    for row in agents:
        assert set(AGENT_FIELDS) <= set(row), row
    rows = {row["agent_id"]: row for row in agents}
    b = rows[busy.agent_id]
    assert (b["state"], b["capabilities"], b["region"], b["version"]) == (
        "healthy", ["lst"], "eu-1", "2.3.0")
    assert (b["inflight"], b["max_concurrency"], b["backlog"]) == (1, 1, 1)
    assert 0 <= b["last_heartbeat_age_s"] < 1.5
    g = rows[gone.agent_id]
    assert (g["state"], g["capabilities"], g["region"], g["version"]) == ("offline", ["rty"], None, None)
    assert (g["inflight"], g["max_concurrency"], g["backlog"]) == (0, 1, 0)
    assert g["last_heartbeat_age_s"] >= settings.offline_after_ms / 1000
    assert [row["agent_id"] for row in only] == [gone.agent_id]

    for row in queues:
        assert set(QUEUE_FIELDS) <= set(row), row
    by_cap = {row["capability"]: row for row in queues}
    assert set(by_cap) == {"lst", "rty"}
    q = by_cap["lst"]
    assert (q["queued"], q["delayed"], q["unread_in_inboxes"], q["running"]) == (1, 0, 1, 1)
    assert (q["agents"], q["healthy_agents"]) == (1, 1)
    assert isinstance(q["oldest_queued_age_s"], int | float) and 0 <= q["oldest_queued_age_s"] < 120
    q = by_cap["rty"]
    assert (q["queued"], q["delayed"], q["unread_in_inboxes"], q["running"]) == (0, 1, 0, 0)
    assert (q["agents"], q["healthy_agents"], q["oldest_queued_age_s"]) == (1, 0, None)


# -- Redis away at start ----------------------------------------------------------------------


def test_a_worker_started_while_redis_is_down_registers_when_it_comes_up(tmp_path: Path) -> None:
    port = free_port()
    settings = Settings.load(redis_url=f"redis://127.0.0.1:{port}/0", prefix="down", **FAST)
    fleet = Fleet(settings, tmp_path)
    server = EmbeddedRedis(port=port)
    try:
        w = fleet.worker("late", handler="tests.handlers:record", wait=False)
        assert w.agent_id
        wait_until(lambda: alive(w) or "unavailable" in w.output(), timeout=20,
                   message="the worker to find Redis down")
        server.start()
        fleet.dispatcher()
        fleet.wait_healthy(w.agent_id, settings, w, timeout=30)
        with ReachClient(settings) as client:
            assert client.run("late", {"n": 1}, timeout=30) == {"n": 1}
        r = redis.Redis.from_url(settings.redis_url, decode_responses=True)
        try:
            # stats come with each heartbeat; the one after the result shows the slot free again
            wait_until(lambda: agent_stats(r, "down", w.agent_id).get("inflight") == 0, timeout=10,
                       message="a heartbeat after the task to show its slot free")
        finally:
            r.close()
        alive(w)
    finally:
        fleet.stop_all()
        server.stop()

