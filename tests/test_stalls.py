"""An agent that stops reading its inbox while it has a free slot (killed, its loop stuck): the
tasks waiting unread there go to other agents at once, not when its heartbeat turns it offline,
and it gets nothing new until it shows life (dispatcher/stalls.py).

Real worker and dispatcher processes, real signals; every state is polled with a deadline.
(SIGKILL, not SIGSTOP: a stopped process's blocking read is still served by Redis, which
delivers it entries that then wait for their lease, as a frozen agent's running tasks do.)
"""

from __future__ import annotations

import redis

from broker import ReachClient
from broker.keys import CapabilityKeys
from broker.models import AgentDescriptor
from broker.protocol.health import SPEED_KNOWN, AgentHealth
from broker.registry import AgentRecord, AgentState
from broker.settings import Settings
from dispatcher.context import DispatcherContext
from dispatcher.routing import Candidate, InboxLoad
from dispatcher.stalls import BUSY_FACTOR, UNREAD_MS, StallWatch
from tests.conftest import Fleet, agent_state_of, wait_until
from tests.registry_reads import first_event, task_events


def test_a_killed_agents_unread_tasks_go_on_at_once_and_it_gets_none_until_it_is_back(
    client: ReachClient, fleet: Fleet, r: redis.Redis, prefix: str, settings: Settings
) -> None:
    cap = "stall"
    ck = CapabilityKeys(prefix, cap)
    fleet.dispatcher()
    dead = fleet.worker(cap, handler="tests.handlers:sleepy", concurrency=2)
    wait_until(lambda: r.llen(ck.grants) > 0, message="grants for the idle agent")
    dead.kill()
    # Its grant hands the task straight to its inbox, where nobody reads it.
    stuck = client.submit(cap, {"n": "stuck", "s": 0})
    other = fleet.worker(cap, handler="tests.handlers:sleepy", concurrency=2)
    assert stuck.result(timeout=30) == {"slept": 0, "attempt": 1}
    events = task_events(r, prefix, stuck.task_id)
    assert [e["type"] for e in events] == ["queued", "dispatched", "reclaimed", "queued",
                                           "dispatched", "accepted", "succeeded"]
    dispatched, reclaimed = events[1], first_event(events, "reclaimed")
    assert dispatched["agent_id"] == reclaimed["agent_id"] == dead.agent_id
    assert reclaimed["data"] == {"reason": "agent not reading", "read": False}
    # Once it sat unread for UNREAD_MS (and a check or two more), before the agent's heartbeat
    # would turn it offline.
    waited = reclaimed["time"] - dispatched["time"]
    assert UNREAD_MS <= waited < settings.offline_after_ms, waited
    assert events[4]["agent_id"] == other.agent_id
    # Nothing new for it (a grant written before may still name it: what reaches it so goes
    # back at once): every next task runs on the other agent, at its first attempt.
    more = [client.submit(cap, {"n": f"m{i}", "s": 0}) for i in range(6)]
    assert [h.result(timeout=30) for h in more] == [{"slept": 0, "attempt": 1}] * 6
    assert {h.status().agent_id for h in more} == {other.agent_id}
    # Restarted under its id once it is offline (as a supervisor would): it gets tasks again
    # (low priority ones: back from offline, it is cold for a while).
    wait_until(lambda: agent_state_of(settings, str(dead.agent_id)) is AgentState.OFFLINE,
               message="the killed agent offline")
    back = fleet.worker(cap, handler="tests.handlers:sleepy", concurrency=2, agent_id=dead.agent_id)

    def ran_on_the_restarted_agent() -> bool:
        handle = client.submit(cap, {"n": "again", "s": 0.2}, priority=settings.cold_start_max_priority)
        assert handle.result(timeout=30)["slept"] == 0.2
        return handle.status().agent_id == back.agent_id

    wait_until(ran_on_the_restarted_agent, timeout=30, message="a task on the restarted agent")


def test_an_agent_marked_as_not_reading_is_routed_again_once_it_shows_life() -> None:
    # Marked at 10,000 ms with 1 task read, the last delivered entry 9000-0: out of routing
    # until its inbox moves, or it heartbeats with its loop having progressed since the mark.
    ctx = DispatcherContext.connect(Settings.load(redis_url="redis://unused:1/0", prefix="st"))
    watch = StallWatch(ctx, CapabilityKeys("st", "cap"))
    watch.marked["a"] = (10_000, 1, "9000-0")
    a, b = (Candidate(name, 4, InboxLoad()) for name in "ab")
    kept, filtered = watch.routable([a, b], {"c": "state:suspect"})
    assert kept == [b] and filtered == {"a": "not_reading", "c": "state:suspect"}

    def record(last_seen: int, progress_age: int) -> AgentRecord:
        return AgentRecord("a", AgentDescriptor(agent_id="a", capabilities=["cap"]), last_seen, 0, 0,
                           stats={"loop_progress_age_ms": progress_age})

    mark = watch.marked["a"]
    assert not watch._alive(record(9_900, 0), mark, (1, "9000-0"))
    assert not watch._alive(record(10_200, 5_000), mark, (1, "9000-0"))  # (its loop is stuck)
    assert watch._alive(record(10_200, 100), mark, (1, "9000-0"))
    held = record(10_200, 100)
    held.stats["held_slots"] = 8  # (every slot held by a handler past its timeout)
    assert not watch._alive(held, mark, (1, "9000-0"))
    assert watch._alive(record(9_900, 0), mark, (0, "9000-0"))  # it finished its task
    assert watch._alive(record(9_900, 0), mark, (2, "9500-0"))  # it read one


def test_how_long_an_entry_may_wait_behind_busy_slots() -> None:
    # BUSY_FACTOR times the agent's told speed (else its heartbeat's p50), UNREAD_MS at least;
    # not known: never (a new agent's prefetch waits for its slot).
    healths = {"told": AgentHealth(speed_ms=100.0, speed_samples=SPEED_KNOWN),
               "fast": AgentHealth(speed_ms=10.0, speed_samples=SPEED_KNOWN),
               "young": AgentHealth(speed_ms=100.0, speed_samples=SPEED_KNOWN - 1)}
    ctx = DispatcherContext.connect(Settings.load(redis_url="redis://unused:1/0", prefix="st"))
    watch = StallWatch(ctx, CapabilityKeys("st", "cap"), healths.get)

    def record(name: str, **stats: float) -> AgentRecord:
        return AgentRecord(name, AgentDescriptor(agent_id=name, capabilities=["cap"]), 0, 0, 0,
                           stats=dict(stats))

    assert watch._busy_patience(record("told", latency_p50_ms=900.0)) == BUSY_FACTOR * 100
    assert watch._busy_patience(record("fast")) == UNREAD_MS
    assert watch._busy_patience(record("young", latency_p50_ms=80.0)) == BUSY_FACTOR * 80
    assert watch._busy_patience(record("young")) is None
