"""Issue 3: an agent's life as the registry sees it: health states, draining and pruning.

Every worker is a real `python -m reach_cli.worker` process and every dispatcher a real
`python -m reach_cli dispatcher`; health is driven with real signals (SIGSTOP/SIGCONT/SIGTERM/
SIGKILL) and judged, as the product does, from the Redis server clock. The state a test relies on
(what sits in an inbox, what the registry recorded) is read from Redis and polled with a
deadline, never assumed after a sleep.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import pytest
import redis

from broker import ReachClient
from broker.ids import split_task_id
from broker.keys import CapabilityKeys, RegistryKeys
from broker.ops.overview import agent_rows
from broker.protocol.delivery import AgentBatch, dispatch_call, parse_dispatch
from broker.registry import AgentState
from broker.scripts import Scripts
from broker.settings import Settings
from tests.conftest import Fleet, agent_state_of, wait_until
from tests.handlers import runs
from tests.registry_handlers import unblocked_key
from tests.registry_reads import (
    MakeSettings,
    agent_hash,
    agent_stats,
    alive,
    first_event,
    holds_one_running_one_unread,
    inbox_load,
    now_ms,
    recorded_state,
    registry_events,
    state_changes,
    task_events,
    wait_pruned,
)

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
            # (on the test's open client: the suspect state lasts 1.5 s, and polls must not
            # step over it)
            state = agent_state_of(settings, w.agent_id or "", r)
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


@pytest.mark.one_redis
@pytest.mark.parametrize("how", ["execution timeout", "drain"])
def test_a_task_whose_handler_ignores_its_stop_is_given_up_and_runs_again_elsewhere(
    make_settings: MakeSettings, fleet: Fleet, r: redis.Redis, prefix: str, how: str
) -> None:
    # The handler swallows the cancellation (for up to 30 s). Before, its task stayed running,
    # its lease renewed, and a draining worker waited on it for good.
    settings = make_settings(drain_grace_ms=500)
    fleet.dispatcher(settings=settings)
    a = fleet.worker("deaf", handler="tests.registry_handlers:deaf_first_attempt", concurrency=1,
                     settings=settings)
    with ReachClient(settings) as client:
        options = {"timeout_s": 0.5} if how == "execution timeout" else {}
        handle = client.submit("deaf", {"s": 30, "n": "deaf"}, **options)
        wait_until(lambda: handle.status().state == "running", message="the task running")
        b = fleet.worker("deaf", handler="tests.registry_handlers:deaf_first_attempt",
                         concurrency=1, settings=settings)
        started = time.monotonic()
        if how == "drain":
            a.signal(signal.SIGTERM)
            assert a.wait(20) == 0, a.output()[-3000:]
        assert handle.result(timeout=30) == {"attempt": 2}
        assert time.monotonic() - started < 15, "given up far later than STOP_WAIT_S"
        assert handle.status().agent_id == b.agent_id
        assert "giving it up" in a.output()
    assert runs(r, prefix) == {"deaf": 2}


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
    result = parse_dispatch(Scripts(r)(dispatch_call(
        settings, "left", [AgentBatch(a.agent_id, 10, [local])])), 1)
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
        wait_pruned(r, prefix, w.agent_id, timeout=15)
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
            wait_pruned(r, prefix, w.agent_id, timeout=20)
            wait_until(lambda: not r.exists(ck.inbox(w.agent_id or "")), timeout=5,
                       message="its inbox deleted")
        finally:
            w.signal(signal.SIGCONT)
        assert handle.result(timeout=30)["attempt"] == 2, "the lost lease's attempt is not the one kept"
        assert client.run("prunerun", {"n": "b", "s": 0}, timeout=30)["attempt"] == 1
    alive(w)
    assert "Traceback" not in w.output()
