"""Hand-offs that skip a round trip, and the guarantees they keep.

- Direct hand-off: while a capability's queue is empty, submit gives a task without routing
  constraints straight to the agent a dispatcher's grant names (submit.lua, grant.lua).
- Pull: while the queue is deep, an agent holding a standing pull takes the next tasks into its
  inbox as it reports others done, one per slot freed (complete.lua, pulls.lua).
- Agents start what they read at once; a cancel takes an unread entry back, so a canceled
  task never starts.
- Waiters register: unwatched tasks get no done list and publish nothing.
Driven through the product's own scripts where a race must be pinned down, and through real
worker and dispatcher processes otherwise.
"""

from __future__ import annotations

import hashlib
import random
import signal
import time
from collections.abc import Sequence
from typing import Any

import pytest
import redis

from broker import ReachClient, TaskHandle
from broker.client.events import read_events
from broker.ids import split_task_id
from broker.infra import connection
from broker.keys import AGENT_GROUP, CapabilityKeys, Channels
from broker.protocol.agents import bind_call
from broker.protocol.delivery import AgentBatch, dispatch_call
from broker.protocol.grants import Grant, Pull, grant_call, pulls_call
from broker.protocol.reports import CompleteReply, Completion, complete_call, parse_complete
from broker.scripts import Scripts
from broker.settings import Settings
from dispatcher.capability import CapabilityLoop
from dispatcher.context import DispatcherContext
from dispatcher.routing import Candidate, InboxLoad, RoutingRound
from dispatcher.service import Dispatcher
from tests.conftest import Fleet, wait_until
from tests.handlers import runs
from tests.registry_reads import MakeSettings


def bind(r: redis.Redis, settings: Settings, capability: str, agent: str) -> None:
    """An agent's token and inbox, as registration makes them (no process behind it)."""
    sha = hashlib.sha1(f"token-{agent}".encode()).hexdigest()
    Scripts(r)(bind_call(settings, capability, agent, sha))


def grant(r: redis.Redis, settings: Settings, capability: str, *grants: str) -> None:
    Scripts(r)(grant_call(settings, capability, parsed_grants(grants), 60_000))


def parsed_grants(texts: Sequence[str]) -> list[Grant]:
    grants = [Grant.parse(text) for text in texts]
    assert all(g is not None and g.encode() == text for g, text in zip(grants, texts, strict=True))
    return [g for g in grants if g is not None]


def parsed_pulls(texts: dict[str, str]) -> dict[str, Pull]:
    pulls = {agent: Pull.parse(text) for agent, text in texts.items()}
    assert all(p is not None and p.encode() == texts[a] for a, p in pulls.items())
    return {agent: p for agent, p in pulls.items() if p is not None}


def finish_read(r: redis.Redis, settings: Settings, capability: str, agent: str,
                outcome: str = "success", exec_ms: int = 1) -> CompleteReply:
    """Read what the agent's inbox holds and report all of it ended with `outcome`, each after
    `exec_ms`."""
    ck = CapabilityKeys(settings.prefix, capability)
    read = r.xreadgroup(AGENT_GROUP, agent, {ck.inbox(agent): ">"}, count=100)
    body = "{}" if outcome == "success" else "no"
    done = [Completion(entry_id, f["id"], f["fence"], outcome, body, 0, exec_ms)
            for entry_id, f in (read[0][1] if read else [])]
    return parse_complete(Scripts(r)(complete_call(
        settings, capability, agent, f"token-{agent}", done)))


def hand(r: redis.Redis, settings: Settings, capability: str, agent: str, *handles: TaskHandle) -> None:
    """Dispatch these tasks to the agent, as a dispatcher's round would."""
    Scripts(r)(dispatch_call(settings, capability, [AgentBatch(
        agent, 10, [split_task_id(h.task_id)[1] for h in handles])]))


def record(r: redis.Redis, prefix: str, task_id: str) -> dict[str, str]:
    capability, local = split_task_id(task_id)
    return r.hgetall(CapabilityKeys(prefix, capability).task(local))


def one_at_a_time_by_grant(client: ReachClient, r: redis.Redis, prefix: str, capability: str,
                           numbers: range) -> int:
    """Submit one task per number, each waited for (so the agent is idle every time); return
    how many of them went straight to the agent by grant."""
    handles = []
    for i in numbers:
        handles.append(client.submit(capability, {"n": i}))
        assert handles[-1].result(timeout=30) == {"n": i}
    return sum(record(r, prefix, h.task_id)["explain"].split("|")[1] == "grant" for h in handles)


def test_submit_follows_grants_and_skips_the_ones_it_may_not_use(
    client: ReachClient, settings: Settings, r: redis.Redis, prefix: str
) -> None:
    ck = CapabilityKeys(prefix, "grants")
    bind(r, settings, "grants", "live")
    bind(r, settings, "grants", "cold")
    # A grant of an agent that left (no token) is dropped; the next one is used.
    grant(r, settings, "grants", "gone|40|round-1|50|", "live|40|round-1|80.5|")
    first = client.submit("grants", {"n": 1})
    assert first.status().state == "dispatched" and first.status().agent_id == "live"
    assert r.xlen(ck.inbox("live")) == 1 and r.zcard(ck.queue) == 0 and r.llen(ck.grants) == 0
    events = read_events(r, ck.task(split_task_id(first.task_id)[1]), first.task_id)
    assert [(e.type, e.data.get("direct")) for e in events] == [("queued", None), ("dispatched", True)]
    assert record(r, prefix, first.task_id)["explain"] == "round-1|grant|80.5|"
    # A cold agent's grant serves low-priority tasks only; a higher one queues and leaves it.
    grant(r, settings, "grants", "cold|40|round-2|60|1")
    high = client.submit("grants", {"n": 2}, priority=8)
    assert high.status().state == "queued" and r.lrange(ck.grants, 0, -1) == ["cold|40|round-2|60|1"]
    assert 0 < r.pttl(ck.grants) <= 60_000  # (put back, it still dies with its set)
    r.zrem(ck.queue, split_task_id(high.task_id)[1])  # (so that the queue is empty again)
    low = client.submit("grants", {"n": 3}, priority=2)
    assert low.status().agent_id == "cold" and r.llen(ck.grants) == 0
    # Tasks with routing constraints always go through the queue, and so does everything while
    # the queue holds a task: nothing overtakes a waiting task.
    grant(r, settings, "grants", *["live|40|round-3|80|"] * 3)
    session = client.submit("grants", {"n": 4}, session_id="conv")
    assert session.status().state == "queued"
    behind = client.submit("grants", {"n": 5}, priority=9)
    assert behind.status().state == "queued" and r.llen(ck.grants) == 3
    assert int(r.hget(ck.stats, "direct") or 0) == 2


def test_a_grant_is_not_used_once_its_agents_slots_filled_another_way(
    client: ReachClient, settings: Settings, r: redis.Redis, prefix: str
) -> None:
    # A grant carries the most entries its agent's inbox may hold (its slots and the prefetch
    # it is allowed): written while the agent had a free slot, it is dropped unused once the
    # slots filled another way (here a round's hand-off), and the next grant is taken instead.
    cap = "bound"
    ck = CapabilityKeys(prefix, cap)
    for agent in ("busy", "free"):
        bind(r, settings, cap, agent)
    hand(r, settings, cap, "busy", *[client.submit(cap, {"n": i}) for i in range(2)])
    assert r.xlen(ck.inbox("busy")) == 2
    grant(r, settings, cap, "busy|20|round-b|90||2", "free|20|round-b|40||2")
    task = client.submit(cap, {"n": 2})
    assert task.status().agent_id == "free" and r.llen(ck.grants) == 0
    # Below the bound, the grant stands (an old grant without one is never bounded).
    grant(r, settings, cap, "free|20|round-c|40||2", "busy|20|round-c|90|")
    assert client.submit(cap, {"n": 3}).status().agent_id == "free"
    assert client.submit(cap, {"n": 4}).status().agent_id == "busy"
    assert r.xlen(ck.inbox("free")) == 2 and r.xlen(ck.inbox("busy")) == 3


def wake_messages_until_marker(pubsub: Any, r: redis.Redis, channel: str, slot_key: str) -> list[str]:
    """The messages on the wake channel up to now: a marker published last closes them. (It is
    published from the node of `slot_key`, the capability's slot, as the scripts' messages are:
    on Cluster, messages from one node keep their order, from two nodes they need not.)"""
    marker = f"marker {random.random()}"
    r.eval("return redis.call('PUBLISH', ARGV[1], ARGV[2])", 1, slot_key, channel, marker)
    seen: list[str] = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        message = pubsub.get_message(timeout=1.0)
        if message and message["type"] == "message":
            if message["data"] == marker:
                return seen
            seen.append(message["data"])
    raise AssertionError(f"the marker never came back; saw {seen}")


def test_submits_tell_the_dispatchers_of_hand_offs_only_as_the_grants_run_out(
    client: ReachClient, settings: Settings, r: redis.Redis, prefix: str
) -> None:
    # A hand-off changes nothing a dispatcher must act on while most grants stand: a message
    # per hand-off woke every dispatcher for nothing. Submits say how many grants are left
    # when that falls to a power of two below half of those written, or to none: the
    # dispatcher acts below half (above it, completions give grants back as credits).
    channel = Channels(prefix).wake
    slot = CapabilityKeys(prefix, "took").queue
    pubsub = r.pubsub()
    pubsub.subscribe(channel)

    def submit_and_hear(n: int) -> list[str]:
        client.submit("took", {"n": n})
        return wake_messages_until_marker(pubsub, r, channel, slot)

    try:
        bind(r, settings, "took", "live")
        grant(r, settings, "took", *["live|40|round-1|50|"] * 8)
        wake_messages_until_marker(pubsub, r, channel, slot)  # (the subscription is in place)
        assert [submit_and_hear(n) for n in (1, 2, 3)] == [[], [], []]  # 7, 6, 5 left
        assert submit_and_hear(4) == []  # 4 left: a power of two, but not below half of 8
        assert submit_and_hear(5) == []  # 3 left
        assert submit_and_hear(6) == ["took took live 6 -1 1 2"]
        # A batch that goes past a power of two says so once, for the agent it fed.
        client.submit_many("took", [{"n": 7}, {"n": 8}])
        assert wake_messages_until_marker(pubsub, r, channel, slot) == ["took took live 8 -1 2 0"]
        # Grants of a dispatcher that keeps no count (the release before) are told at every
        # power of two, as before: with the count, 2 of 4 left would not be below half.
        grant(r, settings, "took", *["live|40|round-2|50|"] * 4)
        r.delete(CapabilityKeys(prefix, "took").granted)
        assert submit_and_hear(9) == []  # 3 left
        assert submit_and_hear(10) == ["took took live 10 -1 1 2"]
    finally:
        pubsub.close()
    # The dispatcher takes `left` as it is (skipped stale grants and several dispatchers made
    # counting hand-offs down drift), and routes once fewer than half of its grants are left.
    dispatcher = Dispatcher(settings)
    loop = dispatcher.loops["took"] = CapabilityLoop(DispatcherContext.connect(settings), "took")
    loop.grants.written = loop.grants.left = 8
    dispatcher.on_wake("took took live 4 -1 1 4")
    assert loop.grants.left == 4 and not loop._wake.is_set()
    dispatcher.on_wake("took took live 6 -1 1 2")
    assert loop.grants.left == 2 and loop._wake.is_set()
    # (a producer of the release before tells every hand-off, and the count goes down by it)
    dispatcher.on_wake("took took live 7 -1 1")
    assert loop.grants.left == 1


def test_a_completion_pulls_the_next_plain_tasks_while_the_queue_is_deep(
    client: ReachClient, settings: Settings, r: redis.Redis, prefix: str
) -> None:
    cap = "pull"
    ck = CapabilityKeys(prefix, cap)
    scripts = Scripts(r)
    for agent in ("warm", "cold", "idle"):
        bind(r, settings, cap, agent)
    first = client.submit(cap, {"n": 0})
    hand(r, settings, cap, "warm", first)
    queued = [client.submit(cap, {"n": i}) for i in range(1, 6)]
    # No standing pull: a completion takes nothing.
    assert finish_read(r, settings, cap, "warm").pulled == 0 and r.zcard(ck.queue) == 5
    hand(r, settings, cap, "warm", queued[0])
    pulls = {"warm": "10|round-p|71.5|", "cold": "10|round-p|40|1"}
    scripts(pulls_call(settings, cap, parsed_pulls(pulls), 60_000))
    # One slot freed, one task pulled: the queue's front, as the dispatcher would have taken it.
    reply = finish_read(r, settings, cap, "warm")
    assert (reply.statuses, reply.pulled, reply.inbox_len, reply.inbox_pending) == (("ok",), 1, 1, 0)
    assert queued[1].status().state == "dispatched" and queued[1].status().agent_id == "warm"
    assert record(r, prefix, queued[1].task_id)["explain"] == "round-p|pull|71.5|"
    events = read_events(r, ck.task(split_task_id(queued[1].task_id)[1]), queued[1].task_id)
    assert [(e.type, e.data.get("pull")) for e in events] == [("queued", None), ("dispatched", True)]
    assert r.zcard(ck.queue) == 3 and r.hget(ck.stats, "pulled") == "1"
    # A failure (the circuit may be opening) pulls nothing: the dispatcher decides about it.
    assert finish_read(r, settings, cap, "warm", "failure").pulled == 0 and r.zcard(ck.queue) == 3
    # A task with routing constraints at the front stops the pull (the dispatcher places it).
    session = client.submit(cap, {"n": 6}, session_id="conv", priority=9)
    hand(r, settings, cap, "warm", queued[2])
    assert finish_read(r, settings, cap, "warm").pulled == 0
    assert session.status().state == "queued" and r.zcard(ck.queue) == 3
    r.zrem(ck.queue, split_task_id(session.task_id)[1])
    # A cold agent pulls low-priority tasks only; the front here is of priority 5.
    low = client.submit(cap, {"n": 7}, priority=1)
    hand(r, settings, cap, "cold", low)
    assert finish_read(r, settings, cap, "cold").pulled == 0 and r.zcard(ck.queue) == 2
    # Never past the inbox limit: with room for one unread entry, one of two freed slots is refilled.
    scripts(pulls_call(settings, cap, parsed_pulls({"warm": "1|round-q|70|"}), 60_000))
    extra = client.submit(cap, {"n": 8}, priority=9)
    hand(r, settings, cap, "warm", extra, queued[3])
    assert finish_read(r, settings, cap, "warm").pulled == 1 and r.zcard(ck.queue) == 0
    # A draining agent pulls nothing.
    last = [client.submit(cap, {"n": i}) for i in (9, 10)]
    hand(r, settings, cap, "warm", last[0])
    r.hset(ck.tokens, "draining:warm", "1")
    reply = finish_read(r, settings, cap, "warm")  # (queued[4], pulled before, and last[0])
    assert (reply.statuses, reply.pulled, r.zcard(ck.queue)) == (("ok", "ok"), 0, 1)
    assert r.xlen(ck.inbox("idle")) == 0


def test_a_full_inbox_refuses_its_grant(
    client: ReachClient, settings: Settings, r: redis.Redis, prefix: str
) -> None:
    ck = CapabilityKeys(prefix, "fullgrant")
    bind(r, settings, "fullgrant", "small")
    grant(r, settings, "fullgrant", *["small|2|r|1|"] * 4)
    handles = [client.submit("fullgrant", {"n": i}) for i in range(3)]
    assert [h.status().state for h in handles] == ["dispatched", "dispatched", "queued"]
    assert r.xlen(ck.inbox("small")) == 2  # never past the agent's backlog limit


def test_a_quiet_completion_gives_its_grant_back_and_wakes_no_dispatcher(
    make_settings: Any, r: redis.Redis, prefix: str
) -> None:
    # While the queue is empty, a completion of successes only, from an agent with no failures
    # before and a standing grant, changes nothing a dispatcher acts on but the agent's load
    # (which the dispatchers read before their next round): it tells nobody, and each task
    # that came by grant gives that grant back. Anything else is told as before.
    cap = "credit"
    settings = make_settings(latency_ceiling_ms=100)
    client = ReachClient(settings)
    ck = CapabilityKeys(prefix, cap)
    channel = Channels(prefix).wake
    pubsub = r.pubsub()
    pubsub.subscribe(channel)

    def heard() -> list[str]:
        return wake_messages_until_marker(pubsub, r, channel, ck.queue)

    try:
        for agent in ("live", "other"):
            bind(r, settings, cap, agent)
        grant(r, settings, cap, *["live|40|round-1|50|"] * 4)
        heard()  # (the subscription is in place)
        first = client.submit(cap, {"n": 1})
        client.submit(cap, {"n": 2})
        assert r.llen(ck.grants) == 2 and heard() == []  # (2 of 4 left is not below half)
        reply = finish_read(r, settings, cap, "live")
        assert reply.statuses == ("ok", "ok") and first.result(timeout=5) == {}
        assert r.lrange(ck.grants, 0, -1) == ["live|40|round-1|50|"] * 4 and heard() == []
        # A task the agent got otherwise (a dispatcher's round) ends quietly too, but it used no
        # grant and gives none: the grants never outnumber the set written.
        routed = client.submit(cap, {"n": 3}, session_id="s")
        hand(r, settings, cap, "live", routed)
        heard()
        assert finish_read(r, settings, cap, "live").statuses == ("ok",)
        assert r.llen(ck.grants) == 4 and heard() == []
        # A failure is told (the agent's circuit may open), and so is the success that clears it.
        client.submit(cap, {"n": 4})
        assert finish_read(r, settings, cap, "live", "failure").statuses == ("failed",)
        assert heard() == ["free credit live 0 0 1 1 1 0"] and r.llen(ck.grants) == 3
        client.submit(cap, {"n": 5})
        finish_read(r, settings, cap, "live")
        # (Successes tell the agent's speed: 1 ms counts as 10, see broker/protocol/health.py.)
        assert heard() == ["free credit live 0 0 0 1 1 0 10.0 4"] and r.llen(ck.grants) == 2
        # With a task waiting in the queue, the dispatchers must hear of the room.
        waiting = client.submit(cap, {"n": 6})
        queued = client.submit(cap, {"n": 7}, session_id="s")
        heard()
        assert waiting.status().agent_id == "live" and queued.status().state == "queued"
        finish_read(r, settings, cap, "live")
        assert heard() == ["free credit live 0 0 0 1 1 0 10.0 5"] and r.llen(ck.grants) == 1
        r.zrem(ck.queue, split_task_id(queued.task_id)[1])
        # Grants given back to a list that submits emptied die with the set they came from.
        grant(r, settings, cap, "live|40|round-2|60|")
        again = client.submit(cap, {"n": 8})
        assert again.status().agent_id == "live" and not r.exists(ck.grants)
        heard()
        finish_read(r, settings, cap, "live")
        assert r.lrange(ck.grants, 0, -1) == ["live|40|round-2|60|"] and heard() == []
        assert 0 < r.pttl(ck.grants) <= 60_000
        # An agent the standing set does not name, or one that is draining, is told about.
        grant(r, settings, cap, "other|40|round-3|70|")
        hand(r, settings, cap, "live", client.submit(cap, {"n": 9}, session_id="s"))
        heard()
        finish_read(r, settings, cap, "live")
        assert heard() == ["free credit live 0 0 0 1 1 0 10.0 7"]
        grant(r, settings, cap, "live|40|round-4|70|")
        hand(r, settings, cap, "live", client.submit(cap, {"n": 10}, session_id="s"))
        r.hset(ck.tokens, "draining:live", "1")
        heard()
        finish_read(r, settings, cap, "live")
        assert heard() == ["free credit live 0 0 0 1 1 0 10.0 8"] and r.llen(ck.grants) == 1
        # A task over the latency ceiling is told (the agent may be on its way to ejection, or
        # be a slow agent's probe), and gives no grant back.
        r.hdel(ck.tokens, "draining:live")
        grant(r, settings, cap, "live|40|round-5|70|")
        client.submit(cap, {"n": 11})
        heard()
        finish_read(r, settings, cap, "live", exec_ms=500)
        assert heard() == ["free credit live 0 0 0 1 500 0 21.9 9"] and r.llen(ck.grants) == 0
    finally:
        pubsub.close()
        client.close()


def test_a_probe_grant_not_taken_yet_outlives_the_set_that_replaces_it(
    make_settings: Any, r: redis.Redis, prefix: str
) -> None:
    # An agent back from an open circuit gets one probe, by grant while the queue is empty, and
    # the dispatcher counts it as out from then on. A rewrite of the grants that dropped it
    # unused would keep the agent out for a lease with no probe running (rounds come every few
    # milliseconds under load): the rewrite carries it over, first, until a submit takes it.
    cap = "probing"
    settings = make_settings()
    client = ReachClient(settings)
    ck = CapabilityKeys(prefix, cap)
    scripts = Scripts(r)
    probe, plain = "flaky|8|round-1|40|", "solid|8|round-1|60|"

    def rewrite(grants: list[str], probes: list[str]) -> list[Any]:
        return list(scripts(grant_call(settings, cap, parsed_grants(grants), 60_000, probes)))

    try:
        for agent in ("flaky", "solid"):
            bind(r, settings, cap, agent)
        assert rewrite([probe, plain], []) == [2]
        # The next round counts the probe as out: its set does not name flaky.
        assert rewrite(["solid|8|round-2|60|"] * 2, ["flaky"]) == [3, "flaky"]
        assert r.lrange(ck.grants, 0, -1) == [probe] + ["solid|8|round-2|60|"] * 2
        assert r.hget(ck.granted, "flaky") == probe and r.hget(ck.granted, "#") == "3"
        assert r.pttl(ck.grants) > 0 and r.pttl(ck.granted) > 0
        # A submit takes it: the probe is out for real, and the next rewrite has none to carry.
        handle = client.submit(cap, {"n": 1})
        assert client.status(handle.task_id).agent_id == "flaky"
        assert rewrite([plain], ["flaky"]) == [1]
        assert r.lrange(ck.grants, 0, -1) == [plain] and r.hget(ck.granted, "flaky") is None
        # Grants taken back (tasks queued again): nothing is carried, but an unused probe is
        # named, so that the dispatcher can give it by a round instead.
        assert rewrite([probe, plain], []) == [2]
        assert rewrite([], ["flaky"]) == [0, "flaky"]
        assert not r.exists(ck.grants) and not r.exists(ck.granted)
        assert rewrite([], ["flaky"]) == [0]
    finally:
        client.close()


def test_cancel_takes_an_unread_entry_back_so_the_task_never_starts(
    client: ReachClient, settings: Settings, fleet: Fleet, r: redis.Redis, prefix: str
) -> None:
    ck = CapabilityKeys(prefix, "unread")
    bind(r, settings, "unread", "later")
    handle = client.submit("unread", {"n": 1})
    local = split_task_id(handle.task_id)[1]
    Scripts(r)(dispatch_call(settings, "unread", [AgentBatch("later", 10, [local])]))
    assert handle.status().state == "dispatched" and r.xlen(ck.inbox("later")) == 1
    assert client.cancel(handle.task_id) is True
    assert r.xlen(ck.inbox("later")) == 0
    # The agent comes up and reads its inbox: the canceled task is not there to start.
    fleet.worker("unread", handler="tests.handlers:record", agent_id="later")
    fleet.dispatcher()
    assert client.run("unread", {"n": 2}, timeout=30) == {"n": 2}
    assert runs(r, prefix) == {"2": 1}
    assert handle.status().state == "canceled"


def test_a_waiter_whose_pooled_connection_was_cut_still_gets_the_result(
    client: ReachClient, settings: Settings, r: redis.Redis
) -> None:
    # result() waits on the done list through the client's own lean exchange, not redis-py's
    # command path and its retry: a pooled connection that a restart or a proxy cut while it
    # sat idle must not fail the wait. (The pool finds such a one closed and connects again;
    # the exchange's one more try is for a connection that breaks during the call.)
    if connection.is_cluster(r):
        pytest.skip("on Cluster the wait goes through redis-py's cluster client")
    bind(r, settings, "cut", "agent")
    handle = client.submit("cut", {"n": 1})
    hand(r, settings, "cut", "agent", handle)
    assert finish_read(r, settings, "cut", "agent").statuses == ("ok",)
    pool = client._redis.connection_pool
    pooled = pool.get_connection()
    pooled.send_command("CLIENT", "ID")
    connection_id = pooled.read_response()
    pool.release(pooled)
    assert r.client_kill_filter(_id=connection_id) == 1
    assert handle.result(timeout=10) == {}


def test_an_idle_agent_gets_new_tasks_straight_from_submit_and_waiters_are_woken(
    client: ReachClient, fleet: Fleet, r: redis.Redis, prefix: str
) -> None:
    ck = CapabilityKeys(prefix, "direct")
    fleet.dispatcher()
    fleet.worker("direct", handler="tests.handlers:record", concurrency=4)
    assert client.run("direct", {"n": 0}, timeout=30) == {"n": 0}
    wait_until(lambda: r.llen(ck.grants) > 0, message="the dispatcher's grants")
    direct = one_at_a_time_by_grant(client, r, prefix, "direct", range(1, 21))
    assert direct >= 15, "an idle agent's tasks should mostly skip the dispatcher"
    # A burst beyond the grants queues the rest, and the dispatcher routes those.
    burst = client.submit_many("direct", [{"n": i} for i in range(21, 81)])
    assert [h.result(timeout=30) for h in burst] == [{"n": i} for i in range(21, 81)]
    assert set(runs(r, prefix).values()) == {1} and len(runs(r, prefix)) == 81
    # A task nobody waited for left no done list; result() afterwards still reads it.
    quiet = client.submit_many("direct", [{"n": 100}])[0]
    wait_until(lambda: quiet.status().state == "succeeded", message="the unwatched task")
    local = split_task_id(quiet.task_id)[1]
    assert not r.exists(ck.task_done(local)) and "d" not in record(r, prefix, quiet.task_id)
    assert quiet.result(timeout=5) == {"n": 100}


def test_a_steady_trickle_of_tasks_wakes_no_dispatcher(
    client: ReachClient, fleet: Fleet, r: redis.Redis, prefix: str
) -> None:
    # At low load a task goes producer -> agent -> producer: its hand-off takes a grant, its
    # completion gives the grant back and tells nobody, so no dispatcher wakes per task (that
    # wake-up was most of a dispatcher's work at low load, on the cores the round trip needs).
    ck = CapabilityKeys(prefix, "trickle")
    channel = Channels(prefix).wake
    fleet.dispatcher()
    fleet.worker("trickle", handler="tests.handlers:record", concurrency=4)
    assert client.run("trickle", {"n": 0}, timeout=30) == {"n": 0}
    wait_until(lambda: r.llen(ck.grants) > 0, message="the dispatcher's grants")
    pubsub = r.pubsub()
    pubsub.subscribe(channel)
    try:
        wake_messages_until_marker(pubsub, r, channel, ck.queue)
        direct = one_at_a_time_by_grant(client, r, prefix, "trickle", range(1, 41))
        heard = wake_messages_until_marker(pubsub, r, channel, ck.queue)
    finally:
        pubsub.close()
    # (A grant set that expired under a starved dispatcher, on a loaded machine, would cost a
    # task or two its grant and tell of their completions: a margin for that, not for a
    # message per task. And once, the agent's speed becoming known after its fifth task.)
    assert direct >= 38, f"only {direct} of 40 tasks went straight to the agent"
    told = [m for m in heard if m.split(" ")[:2] in (["free", "trickle"], ["took", "trickle"])]
    assert len(told) <= 3, told
    assert set(runs(r, prefix).values()) == {1} and len(runs(r, prefix)) == 41


def test_after_a_drain_by_pulls_an_idle_agent_again_gets_tasks_straight_from_submit(
    client: ReachClient, fleet: Fleet, r: redis.Redis, prefix: str
) -> None:
    # While the queue is deep the agent refills itself and the dispatcher hears nothing of it
    # (complete.lua publishes no wake-up then): once the queue is empty, the dispatcher must
    # still know the agent's load well enough to grant it the next tasks.
    ck = CapabilityKeys(prefix, "deep")
    fleet.dispatcher()
    fleet.worker("deep", handler="tests.handlers:record", concurrency=4)
    assert client.run("deep", {"n": 0}, timeout=30) == {"n": 0}
    burst = client.submit_many("deep", [{"n": i} for i in range(1, 2001)])
    assert [h.result(timeout=60) for h in burst] == [{"n": i} for i in range(1, 2001)]
    pulled = int(r.hget(ck.stats, "pulled") or 0)
    assert pulled >= 1000, f"only {pulled} of 2000 tasks were pulled"
    wait_until(lambda: r.llen(ck.grants) > 0, message="grants once the queue is empty")
    direct = one_at_a_time_by_grant(client, r, prefix, "deep", range(2001, 2021))
    assert direct >= 15, "after the drain, an idle agent's tasks should skip the dispatcher again"
    assert set(runs(r, prefix).values()) == {1} and len(runs(r, prefix)) == 2021


def test_a_task_that_finds_every_slot_busy_is_pulled_by_the_next_completion_without_a_round(
    fleet: Fleet, r: redis.Redis, prefix: str, make_settings: MakeSettings
) -> None:
    # An agent that finishes less than a task per refill gets no grant beyond its free slots,
    # and pulls stand while the queue is empty too: a task submitted while every slot runs
    # waits in the queue (where the fleet's next free slot takes it), not in a busy agent's
    # inbox, and the completion that frees a slot takes it with no dispatcher round: the
    # dispatcher is stopped meanwhile. (Idle ticks of 2 s: the pulls it wrote stand 6 s.)
    settings = make_settings(idle_tick_ms=2000)
    ck = CapabilityKeys(prefix, "busy")
    dispatcher = fleet.dispatcher(settings=settings)
    worker = fleet.worker("busy", handler="tests.handlers:sleepy", concurrency=1, settings=settings)
    with ReachClient(settings) as client:
        for i in range(6):  # (its speed, 50 ms a task, is known after its fifth)
            assert client.run("busy", {"n": f"w{i}", "s": 0.05}, timeout=30)["slept"] == 0.05
        wait_until(lambda: r.hexists(ck.pulls, str(worker.agent_id)) and r.llen(ck.grants) == 1,
                   message="a standing pull and one grant (the free slot, no prefetch)")
        long = client.submit("busy", {"n": "long", "s": 1.0})
        wait_until(lambda: long.status().state == "running", message="the long task running")
        assert r.llen(ck.grants) == 0
        dispatcher.signal(signal.SIGSTOP)
        try:
            short = client.submit("busy", {"n": "short", "s": 0})
            assert short.status().state == "queued"
            assert short.result(timeout=30) == {"slept": 0, "attempt": 1}
            explain = record(r, prefix, short.task_id)["explain"]
            assert explain.split("|")[1] == "pull", explain
            assert long.result(timeout=30) == {"slept": 1.0, "attempt": 1}
        finally:
            dispatcher.signal(signal.SIGCONT)


def loop_without_service(settings: Settings, capability: str) -> CapabilityLoop:
    """A capability's dispatch loop on its own Redis connection, for a test to drive its
    rounds by hand (no dispatcher service, wake listener or registry refresh around it; its
    registry view is never refreshed: no agents serve)."""
    return CapabilityLoop(DispatcherContext.connect(settings), capability)


@pytest.mark.one_redis
async def test_an_agent_back_from_a_failure_gets_low_priority_grants_at_once(
    make_settings: Any, r: redis.Redis
) -> None:
    # The race the dispatcher can lose: an agent is suspect and healthy again between two of
    # its rounds, so the agents granted are the ones granted a moment ago. The grants must
    # still be rewritten at once, as grants for low-priority tasks only (it is cold now).
    # (A grant set no different from the standing one is written again after a third of its
    # time to live: a long tick keeps that from hiding the race however slow the machine.)
    settings = make_settings(idle_tick_ms=60_000)
    loop = loop_without_service(settings, "back")
    now = int(r.time()[0]) * 1000

    def round_with(recovered_at_ms: int) -> RoutingRound:
        agent = Candidate("back-1", 4, InboxLoad(0, 0), recovered_at_ms=recovered_at_ms)
        return RoutingRound([agent], settings, now, random.Random(1))

    try:
        keys = CapabilityKeys(settings.prefix, "back")
        await loop.grants.grant(round_with(0))
        warm = r.lrange(keys.grants, 0, -1)
        assert warm and all(g.split("|")[4] == "" for g in warm), warm
        await loop.grants.grant(round_with(now))
        cold = r.lrange(keys.grants, 0, -1)
        assert cold and all(g.startswith("back-1|") and g.split("|")[4] == "1" for g in cold), cold
    finally:
        await loop.ctx.close()


@pytest.mark.one_redis
async def test_grants_half_used_are_written_again_by_the_next_round(
    make_settings: Any, r: redis.Redis
) -> None:
    # Submits took more than half of the grants: the round that this calls for must write a
    # full set again even though the same agents are granted. (It used to skip the write as
    # "no different" until a third of the grants' time to live had passed: every further
    # submit then woke a round that did nothing, and the grants ran out, so tasks queued and
    # waited for a round at low load.)
    settings = make_settings(idle_tick_ms=60_000)
    loop = loop_without_service(settings, "refill")
    now = int(r.time()[0]) * 1000
    agent = Candidate("refill-1", 4, InboxLoad(0, 0))
    try:
        keys = CapabilityKeys(settings.prefix, "refill")
        await loop.grants.grant(RoutingRound([agent], settings, now, random.Random(1)))
        full = r.llen(keys.grants)
        assert full >= 4
        used = full // 2 + 1
        for _ in range(used):
            r.lpop(keys.grants)  # as submits take them
        loop.on_took(used)
        await loop.grants.grant(RoutingRound([agent], settings, now, random.Random(1)))
        assert r.llen(keys.grants) == full
        # while fewer than half are used, the standing set is left alone (no write per round)
        r.lpop(keys.grants)
        loop.on_took(1)
        await loop.grants.grant(RoutingRound([agent], settings, now, random.Random(1)))
        assert r.llen(keys.grants) == full - 1
    finally:
        await loop.ctx.close()


@pytest.mark.one_redis
async def test_every_round_while_grants_stand_reads_the_granted_agents_loads_first(
    make_settings: Any, r: redis.Redis
) -> None:
    # Submits hand tasks to granted agents, and their completions end tasks, without telling
    # the dispatchers while the grants stand (see complete.lua): no round may size an agent's
    # room, or its new grants, from a load that leaves out tasks it was handed meanwhile, nor
    # from one that still counts tasks it finished (it would look full and be passed over).
    settings = make_settings(idle_tick_ms=60_000)
    loop = loop_without_service(settings, "unsure")
    now = int(r.time()[0]) * 1000
    bind(r, settings, "unsure", "unsure-1")
    producer = ReachClient(settings)
    try:
        await loop.grants.grant(RoutingRound([Candidate("unsure-1", 4, InboxLoad(0, 0))], settings, now,
                                       random.Random(1)))
        assert r.llen(CapabilityKeys(settings.prefix, "unsure").grants) >= 4
        for n in range(3):
            assert producer.submit("unsure", {"n": n}).status().agent_id == "unsure-1"
        assert "unsure-1" not in loop.observations.loads  # (nothing told it)
        await loop.route()
        assert loop.observations.loads["unsure-1"] == InboxLoad(3, 0) and not loop.observations.unsure
        # Later rounds too: the three end quietly, two more come by grant. (This loop serves no
        # agent, so its round cleared the grants: they are written again here.)
        await loop.grants.grant(RoutingRound([Candidate("unsure-1", 4, InboxLoad(3, 0))], settings, now,
                                       random.Random(1)))
        assert finish_read(r, settings, "unsure", "unsure-1").statuses == ("ok",) * 3
        for n in range(3, 5):
            assert producer.submit("unsure", {"n": n}).status().agent_id == "unsure-1"
        loop.observations.loads["unsure-1"] = InboxLoad(4, 4)  # (as a stale view would have it: full)
        await loop.route()
        assert loop.observations.loads["unsure-1"] == InboxLoad(2, 0)
    finally:
        producer.close()
        await loop.ctx.close()

