"""Issue 3: the agent registry, health and lifecycle, against real Redis and real processes.

Every worker is a real `python -m agent_worker` process and every dispatcher a real
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
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from agent_worker.registration import register
from broker import ReachClient, TaskHandle, connection, protocol
from broker.embedded import EmbeddedRedis, free_port
from broker.ids import split_task_id
from broker.keys import AGENT_GROUP, CapabilityKeys, RegistryKeys
from broker.models import AgentDescriptor
from broker.overview import agent_rows
from broker.registry import AgentState, server_ms
from broker.results import feed_events, read_events
from broker.scripts import AsyncScripts, Scripts
from broker.settings import Settings
from tests.conftest import FAST, ROOT, Fleet, Proc, agent_state_of, settings_env, wait_until
from tests.handlers import runs
from tests.registry_handlers import unblocked_key

SKEW_DIR = Path(__file__).resolve().parent / "skew"
AGENT_FIELDS = ["agent_id", "state", "capabilities", "region", "version", "inflight",
                "max_concurrency", "last_heartbeat_age_s", "backlog"]
QUEUE_FIELDS = ["capability", "queued", "delayed", "unread_in_inboxes", "running",
                "oldest_queued_age_s", "agents", "healthy_agents"]

MakeSettings = Callable[..., Settings]


# -- reading what Redis says ------------------------------------------------------------------


def now_ms(r: redis.Redis) -> int:
    return server_ms(r.time())


def registry_events(r: redis.Redis, prefix: str, agent_id: str | None = None) -> list[dict[str, str]]:
    events = [fields for _, fields in r.xrange(RegistryKeys(prefix).events)]
    return [e for e in events if agent_id is None or e.get("agent_id") == agent_id]


def state_changes(r: redis.Redis, prefix: str, agent_id: str) -> list[str]:
    """The transitions the dispatcher(s) recorded for an agent, as "old -> new"."""
    return [e["detail"] for e in registry_events(r, prefix, agent_id) if e["type"] == "state"]


def agent_hash(r: redis.Redis, prefix: str, agent_id: str) -> dict[str, str]:
    return r.hgetall(RegistryKeys(prefix).agent(agent_id))


def agent_stats(r: redis.Redis, prefix: str, agent_id: str) -> dict[str, Any]:
    return json.loads(agent_hash(r, prefix, agent_id).get("stats") or "{}")


def recorded_state(r: redis.Redis, prefix: str, agent_id: str) -> str | None:
    return r.hget(RegistryKeys(prefix).agent(agent_id), "state")


def task_events(r: redis.Redis, prefix: str, task_id: str) -> list[dict[str, Any]]:
    capability, local = split_task_id(task_id)
    key = CapabilityKeys(prefix, capability).task(local)
    return [e.as_dict() for e in read_events(r, key, task_id)]


def task_record(r: redis.Redis, prefix: str, task_id: str) -> dict[str, str]:
    capability, local = split_task_id(task_id)
    return r.hgetall(CapabilityKeys(prefix, capability).task(local))


def first_event(events: list[dict[str, Any]], etype: str) -> dict[str, Any]:
    found = [e for e in events if e["type"] == etype]
    assert found, f"no {etype!r} event in {[e['type'] for e in events]}"
    return found[0]


def inbox_load(r: redis.Redis, prefix: str, capability: str, agent_id: str) -> tuple[int, int]:
    """(entries in the agent's inbox, of which the agent has read)."""
    inbox = CapabilityKeys(prefix, capability).inbox(agent_id)
    length = r.xlen(inbox)
    try:
        pending = int(r.xpending(inbox, AGENT_GROUP)["pending"])
    except redis.exceptions.ResponseError:  # no group yet
        pending = 0
    return length, pending


def inbox_entries(r: redis.Redis, prefix: str, capability: str, agent_id: str) -> dict[str, tuple[str, str]]:
    """local task id -> (inbox entry id, fencing token) of each entry in the agent's inbox."""
    inbox = CapabilityKeys(prefix, capability).inbox(agent_id)
    return {fields["id"]: (entry_id, fields["fence"]) for entry_id, fields in r.xrange(inbox)}


def reach_json(settings: Settings, *args: str) -> Any:
    done = subprocess.run([sys.executable, "-m", "reach_cli", *args, "--json"],
                          env=settings_env(settings), cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def alive(proc: Proc) -> None:
    assert proc.popen.poll() is None, f"{proc.name} exited:\n{proc.output()[-3000:]}"


def holds_one_running_one_unread(r: redis.Redis, prefix: str, capability: str, proc: Proc,
                                 running: TaskHandle) -> bool:
    """The agent read one entry and accepted its task (`running`); one more waits unread."""
    alive(proc)
    assert proc.agent_id
    return (inbox_load(r, prefix, capability, proc.agent_id) == (2, 1)
            and running.status().state == "running")


# -- health states driven by real signals -----------------------------------------------------


def test_sigstop_goes_suspect_then_offline_and_sigcont_brings_it_back_recorded_once(
    settings: Settings, fleet: Fleet, r: redis.Redis, prefix: str, client: ReachClient
) -> None:
    # Two dispatchers watch the same agent: each transition must still be recorded once.
    fleet.dispatcher()
    fleet.dispatcher()
    w = fleet.worker("life", handler="tests.handlers:record", concurrency=2)
    assert w.agent_id
    wait_until(lambda: state_changes(r, prefix, w.agent_id) == ["new -> healthy"],
               message="the dispatchers to record the new agent as healthy")
    registered = [e for e in registry_events(r, prefix, w.agent_id) if e["type"] == "registered"]
    assert len(registered) == 1 and registered[0]["detail"] == "" and int(registered[0]["time"]) > 0

    seen: list[AgentState | None] = []

    def reaches(target: AgentState) -> Callable[[], bool]:
        def check() -> bool:
            state = agent_state_of(settings, w.agent_id or "")
            if not seen or seen[-1] is not state:
                seen.append(state)
            return state is target
        return check

    w.signal(signal.SIGSTOP)
    try:
        wait_until(reaches(AgentState.SUSPECT), timeout=10, interval=0.01, message="suspect")
        wait_until(reaches(AgentState.OFFLINE), timeout=10, interval=0.01, message="offline")
        # Offline keeps the record (it rejoins on its next heartbeat).
        assert agent_hash(r, prefix, w.agent_id)["agent_id"] == w.agent_id
        assert r.zscore(RegistryKeys(prefix).agents, w.agent_id) is not None
        wait_until(lambda: recorded_state(r, prefix, w.agent_id or "") == "offline",
                   message="the dispatcher to record offline")
    finally:
        w.signal(signal.SIGCONT)
    wait_until(reaches(AgentState.HEALTHY), timeout=10, message="healthy again after SIGCONT")
    assert seen == [AgentState.HEALTHY, AgentState.SUSPECT, AgentState.OFFLINE, AgentState.HEALTHY]
    expected = ["new -> healthy", "healthy -> suspect", "suspect -> offline", "offline -> healthy"]
    wait_until(lambda: state_changes(r, prefix, w.agent_id or "") == expected,
               message=f"state changes {expected}")
    # The recovered agent works again (priority 0: cold-start protection may hold back the rest).
    assert client.run("life", {"n": 1}, priority=0, timeout=30) == {"n": 1}
    assert state_changes(r, prefix, w.agent_id) == expected, "every change recorded exactly once"
    alive(w)


def test_a_suspect_agent_gets_no_new_tasks(
    make_settings: MakeSettings, fleet: Fleet, r: redis.Redis, prefix: str
) -> None:
    # A long suspect phase, so that the stopped agent stays suspect (never offline) throughout.
    settings = make_settings(suspect_after_ms=1000, offline_after_ms=120_000)
    fleet.dispatcher(settings=settings)
    stopped = fleet.worker("sus", handler="tests.handlers:record", concurrency=4, settings=settings)
    other = fleet.worker("sus", handler="tests.handlers:record", concurrency=4, settings=settings)
    assert stopped.agent_id and other.agent_id
    stopped.signal(signal.SIGSTOP)
    try:
        wait_until(lambda: recorded_state(r, prefix, stopped.agent_id or "") == "suspect",
                   message="the dispatcher to see the stopped agent as suspect")
        with ReachClient(settings) as client:
            handles = client.submit_many("sus", [{"n": i} for i in range(20)])
            assert [h.result(timeout=30) for h in handles] == [{"n": i} for i in range(20)]
            assert {h.status().agent_id for h in handles} == {other.agent_id}
        assert inbox_load(r, prefix, "sus", stopped.agent_id) == (0, 0)
        assert agent_state_of(settings, stopped.agent_id) is AgentState.SUSPECT
    finally:
        stopped.signal(signal.SIGCONT)


def test_an_offline_agents_unread_tasks_are_rerouted_and_complete(
    settings: Settings, fleet: Fleet, r: redis.Redis, prefix: str, client: ReachClient
) -> None:
    a = fleet.worker("off", handler="tests.handlers:sleepy", concurrency=1)
    assert a.agent_id
    # Queued before any dispatcher runs: the idle agent then gets both in one hand-off (one free
    # slot + a prefetch of one); it runs the long one and the short one waits unread.
    long = client.submit("off", {"s": 30, "n": "long"}, priority=9)
    short = client.submit("off", {"s": 0.1, "n": "short"}, priority=1)
    fleet.dispatcher()
    wait_until(lambda: holds_one_running_one_unread(r, prefix, "off", a, long),
               message="one running and one unread task in the agent's inbox")
    assert long.status().state == "running" and short.status().state == "dispatched"
    b = fleet.worker("off", handler="tests.handlers:sleepy", concurrency=2)
    a.signal(signal.SIGSTOP)
    try:
        assert short.result(timeout=30) == {"slept": 0.1, "attempt": 1}
        last_seen = int(agent_hash(r, prefix, a.agent_id)["last_seen"])
        events = task_events(r, prefix, short.task_id)
        assert [e["type"] for e in events] == ["queued", "dispatched", "reclaimed", "queued",
                                               "dispatched", "accepted", "succeeded"]
        reclaimed = first_event(events, "reclaimed")
        assert reclaimed["data"] == {"reason": "agent offline", "read": False}
        assert reclaimed["agent_id"] == a.agent_id
        # Handed on when the agent was offline by the server clock (not earlier, not much later).
        assert reclaimed["time"] >= last_seen + settings.offline_after_ms - 100
        assert reclaimed["time"] <= last_seen + settings.offline_after_ms + 5000
        assert events[4]["agent_id"] == b.agent_id and events[-1]["agent_id"] == b.agent_id
        assert runs(r, prefix)["short"] == 1
        # The task the offline agent had read is handed on too, as a new attempt.
        wait_until(lambda: long.status().agent_id == b.agent_id and long.status().state == "running",
                   message="the long task running again on the other agent")
        assert long.status().attempt == 2
        assert any(e["type"] == "reclaimed" and e["data"]["read"] is True
                   for e in task_events(r, prefix, long.task_id))
        assert agent_state_of(settings, a.agent_id) is AgentState.OFFLINE
    finally:
        a.signal(signal.SIGCONT)
    # Back from the dead: it rejoins with its kept record, and its superseded attempt's report
    # is refused instead of overwriting the new attempt.
    fleet.wait_healthy(a.agent_id, settings, a, timeout=10)
    wait_until(lambda: any(e["type"] == "late_result_rejected" and e["agent_id"] == a.agent_id
                           for e in task_events(r, prefix, long.task_id)),
               timeout=10, message="the old attempt's late report rejected")
    assert long.status().state == "running" and long.status().agent_id == b.agent_id
    # Right after SIGCONT its first beat may still show the frozen loop (not_ready) for a moment.
    wait_until(lambda: state_changes(r, prefix, a.agent_id or "")[-1].endswith("-> healthy"),
               message="the return recorded")
    changes = state_changes(r, prefix, a.agent_id)
    assert changes[:3] == ["new -> healthy", "healthy -> suspect", "suspect -> offline"]
    assert changes[3:] in (["offline -> healthy"], ["offline -> not_ready", "not_ready -> healthy"])


def test_a_warming_agent_gets_nothing_until_its_warmup_ends(
    settings: Settings, fleet: Fleet, r: redis.Redis, prefix: str, client: ReachClient
) -> None:
    # The task waits before the agent exists, and the dispatcher serves its capability before
    # the agent registers: it could hand the task over the moment the agent shows up.
    handle = client.submit("warm", {"n": 1})
    d = fleet.dispatcher()
    wait_until(lambda: "serving capability warm" in d.output(), message="the dispatcher serving")
    w = fleet.worker("warm", handler="tests.handlers:record", concurrency=4, wait=False,
                     extra_args=["--warmup-s", "2"])
    assert w.agent_id
    wait_until(lambda: agent_state_of(settings, w.agent_id or "") is AgentState.WARMING,
               message="the agent registered and warming")
    warm_until = int(agent_hash(r, prefix, w.agent_id)["warm_until"])
    checked_while_warming = 0

    def finished() -> bool:
        nonlocal checked_while_warming
        alive(w)
        state = handle.status().state
        if agent_state_of(settings, w.agent_id or "") is AgentState.WARMING:
            assert inbox_load(r, prefix, "warm", w.agent_id or "")[0] == 0
            checked_while_warming += 1
        return state == "succeeded"

    wait_until(finished, timeout=20, message="the task to run once the warmup ended")
    assert checked_while_warming > 10, "the agent was observed warming with an empty inbox"
    assert first_event(task_events(r, prefix, handle.task_id), "dispatched")["time"] >= warm_until
    assert handle.status().agent_id == w.agent_id
    wait_until(lambda: state_changes(r, prefix, w.agent_id or "") == ["new -> warming",
                                                                     "warming -> healthy"],
               message="warming -> healthy recorded")


def test_a_worker_whose_handler_blocks_its_executor_is_not_ready_while_its_heartbeat_lives(
    make_settings: MakeSettings, fleet: Fleet, r: redis.Redis, prefix: str
) -> None:
    # The lease outlasts the block: the renewer runs on the very loop the handler blocks.
    settings = make_settings(stall_after_ms=500, lease_ms=20_000)
    fleet.dispatcher(settings=settings)
    w = fleet.worker("stuck", handler="tests.registry_handlers:stall", concurrency=4,
                     settings=settings)
    assert w.agent_id
    with ReachClient(settings) as client:
        first = client.submit("stuck", {"s": 4, "n": "first"})
        wait_until(lambda: recorded_state(r, prefix, w.agent_id or "") == "not_ready", timeout=10,
                   message="the dispatcher to mark the stuck agent not_ready")
        # Liveness is not readiness: beats keep coming while the executor is stuck.
        beats: set[str] = set()

        def beating_while_stuck() -> bool:
            last_seen = agent_hash(r, prefix, w.agent_id or "")["last_seen"]
            if agent_state_of(settings, w.agent_id or "") is AgentState.NOT_READY:
                beats.add(last_seen)
            return len(beats) >= 3

        wait_until(beating_while_stuck, timeout=3, message="heartbeats while not_ready")
        stats = agent_stats(r, prefix, w.agent_id)
        assert stats["inflight"] == 1 and stats["loop_progress_age_ms"] >= 500
        # The agent has free slots, yet a new task waits until the executor moves again
        # (priority 0: cold-start protection may keep a recovered agent on low-priority work).
        second = client.submit("stuck", {"s": 0, "n": "second"}, priority=0)
        assert first.result(timeout=30) == {"blocked_s": 4}
        assert second.result(timeout=30) == {"blocked_s": 0}
    unblocked_at = int(r.hget(unblocked_key(prefix), "first") or 0)
    dispatched = first_event(task_events(r, prefix, second.task_id), "dispatched")
    assert dispatched["agent_id"] == w.agent_id
    assert dispatched["time"] >= unblocked_at, "a task was dispatched to a not_ready agent"
    changes = state_changes(r, prefix, w.agent_id)
    assert changes == ["new -> healthy", "healthy -> not_ready", "not_ready -> healthy"]


# -- draining ---------------------------------------------------------------------------------


def test_sigterm_drains_in_flight_tasks_hands_back_unread_ones_at_once_and_deregisters(
    settings: Settings, fleet: Fleet, r: redis.Redis, prefix: str, client: ReachClient
) -> None:
    a = fleet.worker("drain", handler="tests.handlers:sleepy", concurrency=2)
    assert a.agent_id
    busy = [client.submit("drain", {"s": 4, "n": f"busy{i}"}, priority=9) for i in range(2)]
    unread = client.submit("drain", {"s": 0.1, "n": "unread"}, priority=1)
    fleet.dispatcher()
    # (Read and accepted are two steps: wait for both.)
    wait_until(lambda: inbox_load(r, prefix, "drain", a.agent_id or "") == (3, 2)
               and [h.status().state for h in busy] == ["running", "running"],
               message="two running and one unread task in the agent's inbox")
    b = fleet.worker("drain", handler="tests.handlers:sleepy", concurrency=2)
    term_at = now_ms(r)
    a.signal(signal.SIGTERM)
    wait_until(lambda: agent_state_of(settings, a.agent_id or "") is AgentState.DRAINING,
               timeout=10, message="draining")
    # A draining agent takes nothing new.
    later = client.submit_many("drain", [{"s": 0, "n": f"later{i}"} for i in range(4)])

    assert a.wait(30) == 0, a.output()[-3000:]
    assert [h.result(timeout=30) for h in busy] == [{"slept": 4, "attempt": 1}] * 2
    assert unread.result(timeout=30) == {"slept": 0.1, "attempt": 1}
    for h in later:
        h.result(timeout=30)
    assert {h.status().agent_id for h in busy} == {a.agent_id}, "in-flight tasks finished in place"
    assert {h.status().agent_id for h in [unread, *later]} == {b.agent_id}
    counts = runs(r, prefix)
    assert counts == {"busy0": 1, "busy1": 1, "unread": 1, **{f"later{i}": 1 for i in range(4)}}

    events = task_events(r, prefix, unread.task_id)
    assert [e["type"] for e in events] == ["queued", "dispatched", "reclaimed", "queued",
                                           "dispatched", "accepted", "succeeded"]
    reclaimed = first_event(events, "reclaimed")
    assert reclaimed["data"] == {"reason": "agent draining", "read": False}
    # At once: long before the in-flight tasks ended.
    busy_done = min(first_event(task_events(r, prefix, h.task_id), "succeeded")["time"] for h in busy)
    assert reclaimed["time"] - term_at < 1500 and reclaimed["time"] < busy_done

    # Deregistered: record, membership and token gone; the registry stream tells the story.
    assert agent_hash(r, prefix, a.agent_id) == {}
    assert r.zscore(RegistryKeys(prefix).agents, a.agent_id) is None
    assert r.hget(CapabilityKeys(prefix, "drain").tokens, a.agent_id) is None
    mine = registry_events(r, prefix, a.agent_id)
    assert [e["type"] for e in mine if e["type"] in ("registered", "deregistered")] == [
        "registered", "deregistered"]
    assert mine[-1]["type"] == "deregistered"
    assert any(e["type"] == "mode" and e["detail"] == "draining" for e in mine)
    assert state_changes(r, prefix, a.agent_id) == ["new -> healthy", "healthy -> draining"]
    log = a.output()
    assert "draining" in log and "Traceback" not in log


def test_tasks_still_running_when_the_drain_grace_ends_are_handed_on_not_failed(
    make_settings: MakeSettings, fleet: Fleet, r: redis.Redis, prefix: str
) -> None:
    settings = make_settings(drain_grace_ms=1000)
    fleet.dispatcher(settings=settings)
    a = fleet.worker("grace", handler="tests.registry_handlers:slow_first_attempt", concurrency=1,
                     settings=settings)
    with ReachClient(settings) as client:
        handle = client.submit("grace", {"s": 60, "n": "long"})
        wait_until(lambda: handle.status().state == "running", message="the task running")
        assert handle.status().agent_id == a.agent_id
        b = fleet.worker("grace", handler="tests.registry_handlers:slow_first_attempt",
                         concurrency=1, settings=settings)
        started = time.monotonic()
        a.signal(signal.SIGTERM)
        assert a.wait(20) == 0, a.output()[-3000:]
        assert time.monotonic() - started < 8, "the drain outlived its grace period"
        # Past the grace the task goes back to the fleet: it is not lost, nor failed for good.
        assert handle.result(timeout=30) == {"attempt": 2}
        assert handle.status().agent_id == b.agent_id
    assert runs(r, prefix) == {"long": 2}
    assert r.xlen(CapabilityKeys(prefix, "grace").dlq) == 0


def test_a_task_handed_to_an_agent_that_just_deregistered_is_not_lost(
    settings: Settings, fleet: Fleet, r: redis.Redis, prefix: str, client: ReachClient
) -> None:
    fleet.dispatcher()
    a = fleet.worker("left", handler="tests.handlers:record", concurrency=2)
    assert a.agent_id
    assert client.run("left", {"n": 0}, timeout=30) == {"n": 0}
    a.signal(signal.SIGTERM)
    assert a.wait(20) == 0, a.output()[-3000:]
    assert agent_hash(r, prefix, a.agent_id) == {}
    handle = client.submit("left", {"n": 1})
    # Another dispatcher whose registry view is a moment old (it has not seen the drain yet)
    # makes its hand-off to the agent it still believes healthy: the product's own script.
    local = split_task_id(handle.task_id)[1]
    result = protocol.parse_dispatch(Scripts(r)(protocol.dispatch_call(
        settings, "left", [protocol.AgentBatch(a.agent_id, 10, [local])])), 1)
    b = fleet.worker("left", handler="tests.handlers:record", concurrency=2)
    # Either the hand-off is refused (the task stays queued for b) or the unread entry of the
    # departed agent's inbox is handed back; never is the task left behind.
    wait_until(lambda: handle.status().state == "succeeded", timeout=10,
               message=f"the task to run on the remaining agent (hand-off: {result})")
    assert handle.status().agent_id == b.agent_id
    assert runs(r, prefix) == {"0": 1, "1": 1}


def test_a_second_signal_exits_at_once_and_the_task_is_handed_on_by_its_lease(
    settings: Settings, fleet: Fleet, r: redis.Redis, prefix: str, client: ReachClient
) -> None:
    fleet.dispatcher()
    w = fleet.worker("twice", handler="tests.handlers:sleepy", concurrency=1)
    assert w.agent_id
    handle = client.submit("twice", {"s": 30, "n": "long"})
    wait_until(lambda: handle.status().state == "running", message="the task running")
    w.signal(signal.SIGTERM)
    wait_until(lambda: agent_hash(r, prefix, w.agent_id or "").get("mode") == "draining",
               timeout=10, message="the worker draining")
    alive(w)  # the first signal drains: the 30 s task keeps it running (grace 10 s)
    started = time.monotonic()
    w.signal(signal.SIGTERM)
    w.wait(10)
    assert time.monotonic() - started < 3, "the second signal did not exit at once"
    assert "second signal" in w.output()
    # Nothing is lost: the lapsed lease hands the task back to the queue.
    wait_until(lambda: handle.status().state == "queued", timeout=15,
               message="the task requeued after its lease lapsed")
    assert any(e["type"] == "reclaimed" and e["data"]["read"] is True
               for e in task_events(r, prefix, handle.task_id))


def test_an_agent_offline_past_prune_after_is_pruned_and_registers_again_when_it_returns(
    make_settings: MakeSettings, fleet: Fleet, r: redis.Redis, prefix: str
) -> None:
    settings = make_settings(prune_after_ms=4000)
    fleet.dispatcher(settings=settings)
    w = fleet.worker("prune", handler="tests.handlers:record", concurrency=2, settings=settings)
    assert w.agent_id
    w.signal(signal.SIGSTOP)
    try:
        wait_until(lambda: [row.state for row in agent_rows(r, settings)] == ["offline"],
                   timeout=10, message="the stopped agent listed as offline")
        wait_until(lambda: any(e["type"] == "pruned" for e in registry_events(r, prefix, w.agent_id or "")),
                   timeout=15, message="the agent pruned")
        # The pruned event comes first; the dispatcher then drops the record, token and inbox.
        wait_until(lambda: r.hget(CapabilityKeys(prefix, "prune").tokens, w.agent_id or "") is None,
                   timeout=5, message="the pruned agent's token dropped")
        assert agent_hash(r, prefix, w.agent_id) == {}
        assert r.zscore(RegistryKeys(prefix).agents, w.agent_id) is None
        assert agent_rows(r, settings) == []
    finally:
        w.signal(signal.SIGCONT)
    # Its next heartbeat is answered "unknown": it registers again and serves.
    fleet.wait_healthy(w.agent_id, settings, w, timeout=15)
    with ReachClient(settings) as client:
        assert client.run("prune", {"n": 1}, priority=0, timeout=30) == {"n": 1}
    registered = [e["detail"] for e in registry_events(r, prefix, w.agent_id) if e["type"] == "registered"]
    assert registered == ["", ""]
    assert [row.agent_id for row in agent_rows(r, settings)] == [w.agent_id]


def test_an_agent_pruned_while_running_a_task_finishes_it_and_serves_on_a_new_inbox(
    make_settings: MakeSettings, fleet: Fleet, r: redis.Redis, prefix: str
) -> None:
    # Frozen mid-task past prune_after: its task is handed on and its (then empty) inbox is
    # deleted. When it wakes, the report of the old task (refused: the token went) and the
    # read that comes with it (NOGROUP: the inbox went) must not stop it.
    settings = make_settings(prune_after_ms=3000)
    fleet.dispatcher(settings=settings)
    w = fleet.worker("prunerun", handler="tests.handlers:sleepy", concurrency=1, settings=settings)
    assert w.agent_id
    ck = CapabilityKeys(prefix, "prunerun")
    with ReachClient(settings) as client:
        handle = client.submit("prunerun", {"n": "a", "s": 1.0})
        wait_until(lambda: handle.status().state == "running", timeout=10, message="the task running")
        w.signal(signal.SIGSTOP)
        try:
            wait_until(lambda: any(e["type"] == "pruned"
                                   for e in registry_events(r, prefix, w.agent_id or "")),
                       timeout=20, message="the frozen agent pruned")
            wait_until(lambda: not r.exists(ck.inbox(w.agent_id or "")), timeout=5,
                       message="its inbox deleted")
        finally:
            w.signal(signal.SIGCONT)
        assert handle.result(timeout=30)["attempt"] == 2, "the lost lease's attempt is not the one kept"
        assert client.run("prunerun", {"n": "b", "s": 0}, timeout=30)["attempt"] == 1
    alive(w)
    assert "Traceback" not in w.output()


# -- tokens -----------------------------------------------------------------------------------


def test_a_forged_heartbeat_or_deregister_with_a_wrong_token_is_refused(
    settings: Settings, fleet: Fleet, r: redis.Redis, prefix: str
) -> None:
    w = fleet.worker("forge", handler="tests.handlers:record")
    assert w.agent_id
    scripts = Scripts(r)
    forged_stats = {"inflight": 99, "loop_progress_age_ms": 0, "draining": True}
    for token in ("not-the-token", ""):
        reply = scripts(protocol.heartbeat_call(settings, w.agent_id, token, forged_stats, "draining"))
        assert reply == ["refused"]
    assert scripts(protocol.deregister_call(settings, w.agent_id, "not-the-token")) == "refused"
    assert scripts(protocol.heartbeat_call(settings, "nobody", "x", {}, "")) == ["unknown"]

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
    accept = protocol.accept_call(settings, "fence", w.agent_id, bad,
                                  [protocol.Delivery(wait_entry, wait_local, wait_fence)])
    assert scripts(accept) == ["REFUSED"]
    complete = protocol.complete_call(settings, "fence", w.agent_id, bad, [protocol.Completion(
        run_entry, run_local, run_fence, "success", '{"forged": true}', 0, 1)])
    assert scripts(complete) == ["REFUSED"]
    assert scripts(protocol.progress_call(settings, "fence", run_local, w.agent_id, bad, run_fence,
                                          {"fraction": 1.0})) == "refused"
    assert scripts(protocol.renew_call(settings, "fence", w.agent_id, bad, [
        protocol.Lease(run_entry, run_local, run_fence)])) == ["REFUSED"]
    # An empty token is no token at all.
    complete_empty = protocol.complete_call(settings, "fence", w.agent_id, "", [protocol.Completion(
        run_entry, run_local, run_fence, "failure", "forged", 0, 1)])
    assert scripts(complete_empty) == ["REFUSED"]

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
    settings: Settings, fleet: Fleet, r: redis.Redis, prefix: str, client: ReachClient
) -> None:
    descriptor = AgentDescriptor(agent_id="reg-1", capabilities=["reg"], max_concurrency=2)

    async def register_twice() -> tuple[str, str, bool, bool]:
        aclient = connection.async_client(settings)
        scripts = AsyncScripts(aclient)
        try:
            first = await register(settings, aclient, scripts, descriptor)
            beat_first = await scripts(protocol.heartbeat_call(settings, "reg-1", first, {}))
            second = await register(settings, aclient, scripts, descriptor)
            beat_old = await scripts(protocol.heartbeat_call(settings, "reg-1", first, {}))
            return first, second, beat_first[0] == "ok", beat_old == ["refused"]
        finally:
            await aclient.aclose()

    first, second, first_was_good, old_refused = asyncio.run(register_twice())
    assert first != second and first_was_good and old_refused
    scripts = Scripts(r)
    assert scripts(protocol.heartbeat_call(settings, "reg-1", second, {}))[0] == "ok"
    # The capability's token hash was replaced too: the old token cannot accept or complete.
    assert scripts(protocol.accept_call(settings, "reg", "reg-1", first, [])) == ["REFUSED"]
    assert scripts(protocol.accept_call(settings, "reg", "reg-1", second, [])) == []
    assert r.zrange(RegistryKeys(prefix).agents, 0, -1) == ["reg-1"]
    details = [e["detail"] for e in registry_events(r, prefix, "reg-1") if e["type"] == "registered"]
    assert details == ["", "re-registered"]

    # A real worker restarted under the same id takes over the same record and serves tasks.
    fleet.dispatcher()
    old = fleet.worker("same", handler="tests.handlers:record", agent_id="same-1")
    old.kill()
    new = fleet.worker("same", handler="tests.handlers:record", agent_id="same-1")
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
    # A retry that waits a minute in `delayed`.
    settings = make_settings(backoff_base_ms=60_000, backoff_max_ms=60_000, backoff_jitter_ms=0)
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

    agents = reach_json(settings, "agents")
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
    only = reach_json(settings, "agents", "--capability", "rty")
    assert [row["agent_id"] for row in only] == [gone.agent_id]

    queues = reach_json(settings, "queues")
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

