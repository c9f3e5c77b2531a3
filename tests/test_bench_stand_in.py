"""The benchmark's stand-in agents (bench/workers/sim_consumer.py) on a real Redis: what the
dispatch figure's `trim` consumer reads from the event feed, and what its script does."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from bench.dispatch_bench import CAP
from bench.workers.sim_consumer import dispatched_to
from broker import ReachClient
from broker.keys import CapabilityKeys, Channels
from broker.protocol.delivery import AgentBatch, dispatch_call
from broker.scripts import Scripts
from tests.conftest import silent_agents, sync_redis

pytestmark = pytest.mark.one_redis

TRIM = (Path(__file__).parents[1] / "bench" / "workers" / "sim_trim_free.lua").read_text()


def test_the_trim_stand_in_empties_exactly_the_inboxes_the_feed_names_and_says_so(redis_url, settings):
    r = sync_redis(redis_url)
    sim = silent_agents(r, settings, 3)
    keys = CapabilityKeys(settings.prefix, CAP)
    with ReachClient(settings) as client:
        client.submit_many(CAP, [{"i": i} for i in range(7)])
    ids = r.zrange(keys.queue, 0, -1)
    # Two tasks to each of the first two agents, none to the third, one call.
    batches = [AgentBatch(sim.ids[0], 100, ids[0:2]), AgentBatch(sim.ids[1], 100, ids[2:4])]
    Scripts(r)(dispatch_call(settings, CAP, batches))
    r.xadd(keys.inbox(sim.ids[2]), {"id": "not-from-the-feed"})  # (only the sweep would take it)

    (_, newest), = r.xrevrange(keys.events, count=1)
    assert dispatched_to(newest["events"]) == {sim.ids[0], sim.ids[1]}
    assert dispatched_to("x|1|queued|5|0||{}\nbroken line") == set()

    pubsub = r.pubsub()
    pubsub.subscribe(Channels(settings.prefix).wake)
    assert pubsub.get_message(timeout=5)["type"] == "subscribe"
    trim = r.register_script(TRIM)
    named = sorted(dispatched_to(newest["events"]))
    wake = Channels(settings.prefix).wake
    assert trim(keys=[keys.inbox(a) for a in named], args=[wake, CAP, *named]) == 4
    assert [r.xlen(keys.inbox(a)) for a in sim.ids] == [0, 0, 1]
    messages = []
    deadline = time.monotonic() + 5
    while len(messages) < 2 and time.monotonic() < deadline:
        message = pubsub.get_message(timeout=0.5)
        if message and message["type"] == "message":
            messages.append(message["data"])
    assert sorted(messages) == [f"free {CAP} {a} 0 0" for a in named]
    # An inbox already empty removes nothing and wakes nobody.
    assert trim(keys=[keys.inbox(a) for a in named], args=[wake, CAP, *named]) == 0
    assert pubsub.get_message(timeout=0.3) is None
    pubsub.close()
    r.close()
