"""A dispatcher's big rounds on a real Redis: a round routed while the last one's dispatch calls
are still in flight (handoff.PIPELINE_MIN_TASKS) hands every task off once, loses none, and
ends with the agents' exact inbox loads."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest

from bench.dispatch_bench import CAP
from broker import ReachClient
from broker.keys import AGENT_GROUP, CapabilityKeys
from broker.settings import Settings
from dispatcher import handoff
from dispatcher.capability import FULL_RECHECK_S, CapabilityLoop
from dispatcher.housekeeping import HOUSEKEEPING_S
from tests.conftest import silent_agents, sync_redis
from tests.test_handoff import loop_without_service

pytestmark = pytest.mark.one_redis

AGENTS = 200  # 4 tasks each per round: rounds of 800, above PIPELINE_MIN_TASKS
TASKS = 2_000


async def route_until_idle(loop: CapabilityLoop) -> None:
    """Rounds as the dispatch loop makes them while they move tasks (bounded, never forever)."""
    for _ in range(50):
        if not await loop.route():
            return
    raise AssertionError("the rounds kept moving tasks 50 times over: they should be done")


def inbox_entries(r: Any, keys: CapabilityKeys, agent_ids: list[str]) -> dict[str, list[str]]:
    return {agent: [fields["id"] for _, fields in r.xrange(keys.inbox(agent))] for agent in agent_ids}


@pytest.mark.parametrize("case", ["alone", "inboxes-filled-meanwhile", "unplaceable-front"])
async def test_rounds_routed_while_calls_are_in_flight_hand_each_task_off_once(
    redis_url: str, settings: Settings, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    interloper = case == "inboxes-filled-meanwhile"
    r = sync_redis(redis_url)
    sim = silent_agents(r, settings, AGENTS)
    keys = CapabilityKeys(settings.prefix, CAP)
    with ReachClient(settings) as client:
        stuck = []
        if case == "unplaceable-front":
            # At the queue's front, tasks for a region no agent is in: every round reads on
            # past them, with the last round's calls in flight (its offset must stay right).
            stuck = [h.task_id.split(":", 1)[1] for h in client.submit_many(
                CAP, [{"stuck": i} for i in range(100)], region="nowhere", priority=9)]
        handles = client.submit_many(CAP, [{"i": i} for i in range(TASKS)])
    task_ids = [h.task_id.split(":", 1)[1] for h in handles]
    loop = loop_without_service(settings, CAP)
    await loop.ctx.view.refresh()
    assert len(loop.observations.candidates()[0]) == AGENTS
    sent: list[int] = []
    filled: dict[str, int] = {}
    send = loop.handoff.send

    def watch_send(batches: Any, rerouted: bool) -> None:
        sent.append(sum(len(b.tasks) for b in batches))
        send(batches, rerouted)
        if interloper and len(sent) <= 2:
            # Something else fills an agent's inbox to its limit before these calls run:
            # dispatch.lua leaves that agent's tasks in the queue, and a later round places
            # them (after the second, the round that finds the queue empty has them in flight).
            batch = next(b for b in batches if b.agent_id not in filled)
            agent = batch.agent_id
            filled[agent] = r.xlen(keys.inbox(agent))  # (what it holds already stays)
            for n in range(batch.max_unread):
                r.xadd(keys.inbox(agent), {"id": f"other-{agent}-{n}"})

    taken: list[int] = []
    note_results = loop.handoff.note_results

    def watch_results(batches: Any, results: Any, rerouted: bool) -> Any:
        taken.append(sum(result.taken for result in results))
        return note_results(batches, results, rerouted)

    queued_at_grants: list[int] = []
    grant = loop.grants.grant

    async def watch_grant(round_: Any) -> None:
        if round_ is not None:  # (a round that found the queue empty grants the room left)
            queued_at_grants.append(r.zcard(keys.queue) - len(stuck))
        await grant(round_)

    monkeypatch.setattr(loop.handoff, "send", watch_send)
    monkeypatch.setattr(loop.handoff, "note_results", watch_results)
    monkeypatch.setattr(loop.grants, "grant", watch_grant)
    try:
        await route_until_idle(loop)
        assert not loop.handoff.in_flight
    finally:
        await loop.ctx.close()
    assert sent and all(n >= handoff.PIPELINE_MIN_TASKS for n in sent), sent
    assert loop.handoff.pipelined_rounds == len(sent) >= (1 if stuck else 2)
    entries = inbox_entries(r, keys, sim.ids)
    handed = Counter(task for ids in entries.values() for task in ids if not task.startswith("other-"))
    assert set(handed) == set(task_ids) and set(handed.values()) == {1}
    assert sorted(r.zrange(keys.queue, 0, -1)) == sorted(stuck)
    # No round chose a task that calls in flight were handing off (it reads past them), and
    # none took the queue for empty while tasks the calls in flight had left were in it.
    assert set(taken) == {0} and queued_at_grants and set(queued_at_grants) == {0}, (taken, queued_at_grants)
    pipe = r.pipeline(transaction=False)
    for task in task_ids:
        pipe.hmget(keys.task(task), "state", "fence")
    assert set(map(tuple, pipe.execute())) == {("dispatched", "1")}
    # The loads the dispatcher goes on with are the inboxes' own, not its optimistic counts.
    assert {a: loop.observations.loads[a].outstanding for a in sim.ids if a in loop.observations.loads} == {
        a: len(ids) for a, ids in entries.items() if a in loop.observations.loads}
    if interloper:
        # The tasks left behind went to other agents, and said so.
        assert len(filled) == 2 and loop.handoff.total_reroutes >= 8
        assert {a: sum(not t.startswith("other-") for t in entries[a]) for a in filled} == filled
    r.close()


async def test_a_round_that_leaves_tasks_queued_takes_the_grants_back(
    redis_url: str, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Grants stand only while the queue is empty (submit hands tasks by grant only then, and
    # completions give grants back only then): a round that leaves tasks queued takes them
    # back. Otherwise every later round under load would go on reading the loads of agents
    # granted long ago (see _route), and the grants would outlive the room they promised.
    r = sync_redis(redis_url)
    silent_agents(r, settings, 20)
    keys = CapabilityKeys(settings.prefix, CAP)
    loop = loop_without_service(settings, CAP)
    refreshed: list[int] = []
    refresh = loop.observations.refresh

    async def watch_refresh(agent_ids: list[str], health: bool = True) -> None:
        refreshed.append(len(agent_ids))
        await refresh(agent_ids, health)

    monkeypatch.setattr(loop.observations, "refresh", watch_refresh)
    try:
        await loop.ctx.view.refresh()
        await loop.route()  # (nothing queued: the room is granted)
        assert r.llen(keys.grants) > 0 and r.exists(keys.granted) and loop.grants.granted
        with ReachClient(settings) as client:  # (sessions: they wait for a round, not a grant)
            client.submit_many(CAP, [{"i": i} for i in range(400)], session_id="s")
        refreshed.clear()
        assert await loop.route()
        assert refreshed == [20]  # (the granted agents' loads first)
        assert r.zcard(keys.queue) > 0, "the round was to leave tasks queued"
        assert not r.exists(keys.grants) and not r.exists(keys.granted) and not loop.grants.granted
        refreshed.clear()
        await loop.route()
        assert refreshed == []  # (no grants stand: nothing changes behind the round's back)
    finally:
        await loop.ctx.close()
        r.close()


async def test_new_tasks_wake_no_round_while_every_agent_is_full(redis_url: str, settings: Settings) -> None:
    # At saturation each submit that queues a task sends a wake-up; a round for each found no
    # room and cost the dispatcher (and Redis) a round trip or two per task. While the last
    # round found every agent full, a new task waits for room in the queue instead: room comes
    # with a completion (which pulls it, or wakes a round) or a registry change (a kick), and
    # a round looks every FULL_RECHECK_S. Housekeeping for a new task's deadline keeps its pace.
    r = sync_redis(redis_url)
    sim = silent_agents(r, settings, 2)
    keys = CapabilityKeys(settings.prefix, CAP)
    with ReachClient(settings) as client:
        client.submit_many(CAP, [{"i": i} for i in range(200)])
    loop = loop_without_service(settings, CAP)
    try:
        await loop.ctx.view.refresh()
        await route_until_idle(loop)
        queued = r.zcard(keys.queue)
        assert 0 < queued < 200, "both agents were to be filled, with tasks left queued"
        assert not await loop.route()  # (a round that finds no room)
        await loop.housekeeping.run()
        loop._wake.clear()
        loop.kick(new_tasks=True)
        assert not loop._wake.is_set()
        assert loop._idle_timeout() <= FULL_RECHECK_S
        assert not loop.housekeeping.due(), "a new task must not hurry housekeeping past its pace"
        assert loop.housekeeping.next_at - time.monotonic() <= HOUSEKEEPING_S  # (yet keeps it)
        loop.kick()  # (a registry change: room may have come)
        assert loop._wake.is_set()

        # Room comes: one agent's inbox emptied (as if it finished and acknowledged its tasks).
        agent = sim.ids[0]
        entries = [entry_id for entry_id, _ in r.xrange(keys.inbox(agent))]
        r.xack(keys.inbox(agent), AGENT_GROUP, *entries)
        r.xdel(keys.inbox(agent), *entries)
        await loop.observations.refresh([agent])
        assert await loop.route()
        assert r.zcard(keys.queue) < queued
        if r.zcard(keys.queue):
            assert not await loop.route()  # (full again)
    finally:
        await loop.ctx.close()
        r.close()
