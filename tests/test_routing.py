"""Routing with real workers: filters, scores, weighted choice, sessions, backpressure, circuits."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from typing import Any

import pytest
import redis

from broker import ReachClient, Settings
from broker.keys import CapabilityKeys
from tests.conftest import ROOT, Fleet, settings_env, wait_until

# (Routing is the dispatcher's choice: the same on every Redis. The scripts it drives run on
# every target in test_delivery, test_handoff and test_dlq; this suite runs on the first only.)
pytestmark = pytest.mark.one_redis


def agent_of(client: ReachClient, handle: Any) -> str:
    return str(client.status(handle.task_id).agent_id)


def spawn(fleet: Fleet, capability: str, settings: Settings, name: str, *args: str,
          concurrency: int = 4, handler: str = "tests.routing_handlers:switchable",
          wait: bool = True) -> Any:
    return fleet.worker(capability, handler=handler, concurrency=concurrency, settings=settings,
                        agent_id=name, extra_args=list(args), env={"REACH_TEST_AGENT": name},
                        wait=wait)


def set_mode(r: redis.Redis, prefix: str, agent: str, mode: str) -> None:
    r.hset(f"{prefix}:test:mode", agent, mode)


def test_region_strict_and_preferred(make_settings: Any, fleet: Fleet) -> None:
    settings = make_settings()
    with ReachClient(settings) as client:
        fleet.dispatcher(settings=settings)
        spawn(fleet, "geo", settings, "eu-1", "--region", "eu")
        spawn(fleet, "geo", settings, "us-1", "--region", "us")
        eu = [client.submit("geo", {"n": i}, region="eu") for i in range(20)]
        for h in eu:
            h.result(timeout=30)
        assert {agent_of(client, h) for h in eu} == {"eu-1"}
        preferred = [client.submit("geo", {"n": i}, region="us", region_strict=False) for i in range(10)]
        for h in preferred:
            h.result(timeout=30)
        assert {agent_of(client, h) for h in preferred} == {"us-1"}
        nowhere = client.submit("geo", {"n": 1}, region="ap", region_strict=False)
        nowhere.result(timeout=30)  # no agent in "ap": preferred falls back to any region
        strict = client.submit("geo", {"n": 2}, region="ap")
        with pytest.raises(TimeoutError):
            strict.result(timeout=1.0)
        assert strict.status().state == "queued"


def test_tasks_no_agent_can_take_do_not_hold_back_the_tasks_behind_them(make_settings: Any,
                                                                          fleet: Fleet) -> None:
    # Twenty tasks for a region no agent serves fill the queue's front (and age there, ahead
    # of anything new); the plain tasks behind them still go to the one agent there is.
    settings = make_settings()
    with ReachClient(settings) as client:
        fleet.dispatcher(settings=settings)
        spawn(fleet, "front", settings, "us-1", "--region", "us", concurrency=2)
        stuck = client.submit_many("front", [{"n": i} for i in range(20)], region="eu")
        plain = [client.submit("front", {"n": 100 + i}) for i in range(5)]
        for h in plain:
            h.result(timeout=30)
        assert {agent_of(client, h) for h in plain} == {"us-1"}
        assert {client.status(h.task_id).state for h in stuck} == {"queued"}


def test_version_constraint(make_settings: Any, fleet: Fleet) -> None:
    settings = make_settings()
    with ReachClient(settings) as client:
        dispatcher = fleet.dispatcher(settings=settings)
        spawn(fleet, "ver", settings, "old", "--version", "1.9.0")
        spawn(fleet, "ver", settings, "new", "--version", "2.3.1")
        handles = [client.submit("ver", {"n": i}, version=">=2.0,<3") for i in range(20)]
        for h in handles:
            h.result(timeout=30)
        assert {agent_of(client, h) for h in handles} == {"new"}
        old = client.submit("ver", {}, version="==1.9")
        old.result(timeout=30)
        assert agent_of(client, old) == "old"
    # (A round whose tasks no agent could take yet is no error: nothing to hand off.)
    assert "dispatch step failed" not in dispatcher.output()
    from broker import BadInput

    with ReachClient(settings) as client, pytest.raises(BadInput, match="invalid version constraint"):
        client.submit("ver", {}, version=">>2")


def test_an_agent_at_the_watermark_receives_nothing_new(make_settings: Any, fleet: Fleet,
                                                       r: redis.Redis, prefix: str) -> None:
    settings = make_settings()
    with ReachClient(settings) as client:
        fleet.dispatcher(settings=settings)
        busy = spawn(fleet, "wm", settings, "busy", concurrency=1, handler="tests.routing_handlers:stall")
        stuck = client.submit("wm", {"s": 30})
        wait_until(lambda: client.status(stuck.task_id).state == "running", message="busy")
        spawn(fleet, "wm", settings, "free", concurrency=4, handler="tests.routing_handlers:stall")
        handles = [client.submit("wm", {"s": 0.01}) for _ in range(30)]
        for h in handles:
            h.result(timeout=30)
        assert {agent_of(client, h) for h in handles} == {"free"}
        assert r.xlen(CapabilityKeys(prefix, "wm").inbox(busy.agent_id or "")) == 1


def test_weighted_random_spreads_load_across_equal_agents(make_settings: Any, fleet: Fleet) -> None:
    settings = make_settings()
    with ReachClient(settings) as client:
        fleet.dispatcher(settings=settings)
        names = [f"eq{i}" for i in range(4)]
        for name in names:
            spawn(fleet, "spread", settings, name, concurrency=8)
        shares: Counter[str] = Counter()
        for i in range(200):
            h = client.submit("spread", {"n": i, "s": 0.001})
            shares[h.result(timeout=30)["agent"]] += 1
        assert set(shares) == set(names)
        assert all(20 <= n <= 80 for n in shares.values()), shares  # 25% each, none over 40%


def test_a_slow_agent_gets_a_clearly_smaller_share(make_settings: Any, fleet: Fleet, r: redis.Redis,
                                                   prefix: str) -> None:
    settings = make_settings()
    with ReachClient(settings) as client:
        fleet.dispatcher(settings=settings)
        spawn(fleet, "speed", settings, "fast", "--region", "f", concurrency=2)
        spawn(fleet, "speed", settings, "slow", "--region", "s", concurrency=2)
        for h in client.submit_many("speed", [{"s": 0.004}] * 1000):
            h.result(timeout=60)  # both agents build a long, fast baseline
        set_mode(r, prefix, "slow", "slow")  # 8 x slower from now on

        def three_times_baseline() -> bool:
            # (Pinned to the slow agent by region, so its recent latency turns quickly.)
            for h in client.submit_many("speed", [{"s": 0.004}] * 20, region="s"):
                h.result(timeout=60)
            stats = json.loads(r.hget(f"{prefix}:{{_registry}}:agent:slow", "stats") or "{}")
            p50, base = stats.get("latency_p50_ms"), stats.get("latency_baseline_ms")
            return bool(p50 and base and p50 > 3 * base)

        wait_until(three_times_baseline, timeout=90, interval=0, message="slow agent at 3x baseline")
        shares = Counter(h.result(timeout=60)["agent"]
                         for h in client.submit_many("speed", [{"s": 0.004}] * 300))
        assert shares["fast"] >= 2 * shares["slow"], shares  # equal agents would split ~50/50
        from dispatcher.explain import live_round

        snapshot = live_round(r, settings, "speed").snapshot()
        penalties = {c["agent_id"]: c["penalty"] for c in snapshot["candidates"]}
        assert penalties.get("slow", settings.slow_penalty) == settings.slow_penalty
        assert penalties.get("fast", 0) == 0


def test_an_agent_turning_slow_mid_run_loses_its_share_within_a_few_of_its_tasks(
    make_settings: Any, fleet: Fleet, r: redis.Redis, prefix: str
) -> None:
    # Four equal agents; one turns 8 x slower. Its completions keep its speed and tell the
    # dispatcher as soon as it moved (the heartbeat's p50 of 100 tasks would take some fifty
    # slow ones, and then a heartbeat): after a handful of slow tasks it gets work only where
    # the others have no room (here they always have) and, when idle, one task a second to
    # measure it again. Tasks go one at a time, so every agent always has room.
    settings = make_settings(heartbeat_ms=1000, suspect_after_ms=10000, offline_after_ms=20000)
    ck = CapabilityKeys(prefix, "turn")
    with ReachClient(settings) as client:
        fleet.dispatcher(settings=settings)
        for name in ("f0", "f1", "f2", "turns"):
            spawn(fleet, "turn", settings, name, concurrency=2)

        def one() -> str:
            return str(client.submit("turn", {"s": 0.02}).result(timeout=60)["agent"])

        before = Counter(one() for _ in range(80))
        assert before["turns"] >= 5, before  # (in the rotation: about a quarter)
        set_mode(r, prefix, "turns", "slow")
        since: list[str] = []

        def clearly_smaller_share() -> bool:
            since.append(one())
            last = since[-60:]
            return len(last) == 60 and last.count("turns") <= 6  # an equal share is 15

        wait_until(clearly_smaller_share, timeout=90, interval=0, message="a smaller share")
        # Within a few of its slow tasks (the rest of them the rechecks), not fifty.
        assert since.count("turns") <= 25, Counter(since)
        speeds = {a: float((r.hget(ck.health, f"sp:{a}") or "0").split(" ")[0])
                  for a in ("f0", "f1", "f2", "turns")}
        assert speeds["turns"] > 3 * max(speeds["f0"], speeds["f1"], speeds["f2"]), speeds
        from dispatcher.explain import live_round

        rows = {c["agent_id"]: c for c in live_round(r, settings, "turn").snapshot()["candidates"]}
        assert rows.get("turns", {"slow": True})["slow"] and not rows["f0"]["slow"]


def test_session_affinity_holds_and_moves_when_its_agent_goes_suspect(
    make_settings: Any, fleet: Fleet
) -> None:
    settings = make_settings(suspect_after_ms=1000, offline_after_ms=60000)
    with ReachClient(settings) as client:
        fleet.dispatcher(settings=settings)
        workers = {name: spawn(fleet, "chat", settings, name) for name in ("c1", "c2", "c3")}
        served = {client.run("chat", {"n": i}, session_id="conv-42", timeout=30)["agent"]
                  for i in range(50)}
        assert len(served) == 1
        first = served.pop()
        workers[first].signal(signal.SIGSTOP)
        try:
            wait_until(lambda: client.run("chat", {"probe": 1}, timeout=30) and
                       _suspect(settings, first), timeout=20, message="the session's agent suspect")
            after = [client.run("chat", {"n": i}, session_id="conv-42", timeout=30)["agent"]
                     for i in range(10)]
            assert first not in after and len(set(after)) == 1, after
        finally:
            workers[first].signal(signal.SIGCONT)


def _suspect(settings: Settings, agent: str) -> bool:
    from tests.conftest import agent_state_of

    state = agent_state_of(settings, agent)
    return state is not None and state.value == "suspect"


def test_backpressure_reroutes_when_an_inbox_reaches_five_times_concurrency(
    make_settings: Any, fleet: Fleet, r: redis.Redis, prefix: str
) -> None:
    settings = make_settings(suspect_after_ms=30000, offline_after_ms=60000)
    ck = CapabilityKeys(prefix, "bp")
    with ReachClient(settings) as client:
        fleet.dispatcher(settings=settings)
        echo = "agent_worker.builtin.echo:handle"  # fast: the dispatcher prefetches deeply
        frozen = spawn(fleet, "bp", settings, "frozen", concurrency=4, handler=echo)
        spawn(fleet, "bp", settings, "other", concurrency=4, handler=echo)
        def both_report_a_fast_p50() -> bool:
            # (Batches until both have run some: an agent the dispatcher has not placed yet
            # can see a batch drained by the other one, pulling as it finishes.)
            for h in client.submit_many("bp", [{"n": i} for i in range(50)]):
                h.result(timeout=30)
            return all(_p50_known(r, prefix, a) for a in ("frozen", "other"))

        wait_until(both_report_a_fast_p50, timeout=60, message="both agents report a latency")
        frozen.signal(signal.SIGSTOP)  # alive for the registry for a while, but reads nothing
        try:
            handles = client.submit_many("bp", [{"n": i} for i in range(300)])
            wait_until(lambda: sum(client.status(h.task_id).state == "succeeded" for h in handles) >= 280,
                       timeout=60, message="the other agent drains the rest")
            unread = r.xlen(ck.inbox("frozen")) - int(r.xpending(ck.inbox("frozen"), "agents")["pending"])
            # Its inbox took a buffer (it was fast), never more than its backlog limit; the
            # rest went to the other agent. (If the stopped agent's last read left a slot free,
            # what sat unread there was taken back, as from an agent that stopped reading:
            # dispatcher/stalls.py. Either way it was never over the limit.)
            assert unread <= 5 * 4, unread
            done = [client.status(h.task_id) for h in handles]
            assert {s.agent_id for s in done if s.state == "succeeded"} == {"other"}
            # Routed past the full inbox by the dispatcher, or pulled by the other agent as it
            # finished tasks (the queue was deep): either way counted.
            stats = r.hgetall(ck.stats)
            assert int(stats.get("reroutes", 0)) + int(stats.get("pulled", 0)) > 0, stats
        finally:
            frozen.signal(signal.SIGCONT)
        for h in handles:
            h.result(timeout=60)


def _p50_known(r: redis.Redis, prefix: str, agent: str) -> bool:
    stats = json.loads(r.hget(f"{prefix}:{{_registry}}:agent:{agent}", "stats") or "{}")
    return stats.get("latency_p50_ms") is not None


def test_circuit_opens_after_ten_failures_and_closes_after_a_good_probe(
    make_settings: Any, fleet: Fleet, r: redis.Redis, prefix: str
) -> None:
    open_ms = 4000
    settings = make_settings(circuit_open_ms=open_ms)
    with ReachClient(settings) as client:
        fleet.dispatcher(settings=settings)
        spawn(fleet, "cb", settings, "flaky", concurrency=2)
        spawn(fleet, "cb", settings, "solid", concurrency=2)
        set_mode(r, prefix, "flaky", "fail")
        ck = CapabilityKeys(prefix, "cb")
        trickle = []
        while int(r.hget(ck.health, "cf:flaky") or 0) < 10:
            trickle.append(client.submit("cb", {"n": len(trickle)}))
            assert len(trickle) < 500, "the failing agent never reached 10 consecutive failures"
            time.sleep(0.005)  # trickle, so both agents keep room
        for h in trickle:  # (a failure at flaky is final: no retry_failures)
            wait_until(lambda h=h: client.status(h.task_id).state in ("succeeded", "failed"),
                       timeout=30, message="the trickle ends")
        # The dispatcher has heard: the grants it left for submits no longer name flaky.
        wait_until(lambda: not any(g.startswith("flaky|") for g in r.lrange(ck.grants, 0, -1)),
                   timeout=10, message="flaky's grants withdrawn")
        opened_until = int(r.hget(ck.health, "lf:flaky") or 0) + open_ms
        placed = []
        for i in range(20):
            h = client.submit("cb", {"n": i})
            wait_until(lambda h=h: client.status(h.task_id).state in ("succeeded", "failed"),
                       timeout=30, message="a task while the circuit is open")
            status = client.status(h.task_id)
            assert status.dispatched_at is not None
            placed.append((status.agent_id, status.dispatched_at.timestamp() * 1000))
        while_open = [agent for agent, at in placed if at < opened_until]
        # Under load the circuit's time may run out during the 20: later ones may be the probe.
        assert len(while_open) >= 5, placed
        assert set(while_open) == {"solid"}, "an open circuit gets nothing"
        set_mode(r, prefix, "flaky", "")
        # After circuit_open_ms one probe goes through; it succeeds and the circuit closes.

        def closed_after_a_probe() -> bool:
            # Each look that finds the circuit open sends one more task: once circuit_open_ms
            # has passed, one of them is the probe.
            if int(r.hget(ck.health, "cf:flaky") or 0) == 0:
                return True
            client.run("cb", {}, timeout=30)
            return False

        wait_until(closed_after_a_probe, timeout=30, message="a good probe")
        later = Counter(client.run("cb", {"n": i}, timeout=30)["agent"] for i in range(60))
        assert later["flaky"] > 5, later


def test_cold_start_agent_gets_only_low_priority_tasks(make_settings: Any, fleet: Fleet,
                                                       r: redis.Redis, prefix: str) -> None:
    settings = make_settings(cold_start_ms=6000, suspect_after_ms=1000, offline_after_ms=60000)
    with ReachClient(settings) as client:
        fleet.dispatcher(settings=settings)
        sick = spawn(fleet, "cold", settings, "sick", concurrency=4)
        spawn(fleet, "cold", settings, "warm", concurrency=4)
        sick.signal(signal.SIGSTOP)
        # Until the dispatcher has seen (and recorded) it suspect, not just until it is.
        wait_until(lambda: r.hget(f"{prefix}:{{_registry}}:agent:sick", "state") == "suspect",
                   message="suspect recorded")
        sick.signal(signal.SIGCONT)
        wait_until(lambda: r.hget(f"{prefix}:{{_registry}}:agent:sick", "recovered_at"),
                   message="recovery recorded")
        recovered = int(r.hget(f"{prefix}:{{_registry}}:agent:sick", "recovered_at") or 0)
        handles = []
        for i in range(60):
            handles.append(client.submit("cold", {"n": i}, priority=8 if i % 2 else 2))
            time.sleep(0.02)  # a steady trickle inside the cold window
        for h in handles:
            h.result(timeout=30)
        on_sick = [client.status(h.task_id) for h in handles if agent_of(client, h) == "sick"]
        cold = [s for s in on_sick if s.dispatched_at and
                s.dispatched_at.timestamp() * 1000 < recovered + 6000]
        assert cold, "the recovered agent got low-priority work while cold"
        assert all(s.priority <= 4 for s in cold), [s.priority for s in cold]


def test_reach_explain(make_settings: Any, fleet: Fleet) -> None:
    settings = make_settings()
    with ReachClient(settings) as client:
        fleet.dispatcher(settings=settings)
        spawn(fleet, "ex", settings, "ex-eu", "--region", "eu")
        spawn(fleet, "ex", settings, "ex-us", "--region", "us")
        done = client.submit("ex", {}, region="eu")
        done.result(timeout=30)
        waiting = client.submit("ex", {}, region="mars")

        def run(task_id: str) -> dict[str, Any]:
            out = subprocess.run([sys.executable, "-m", "reach_cli", "explain", task_id, "--json"],
                                 env=settings_env(settings), cwd=ROOT, capture_output=True,
                                 text=True, timeout=30)
            assert out.returncode == 0, out.stderr
            return json.loads(out.stdout)

        report = run(done.task_id)
        assert report["decision"]["agent_id"] == "ex-eu"
        assert report["decision"]["why"].startswith("weighted")
        assert {c["agent_id"] for c in report["round"]["candidates"]} == {"ex-eu", "ex-us"}
        assert {"free", "affinity", "latency", "stability"} <= set(report["round"]["candidates"][0])
        pending = run(waiting.task_id)
        assert pending["task"]["state"] == "queued" and pending["now"]["would_go_to"] is None
        assert pending["constraints"]["region"] == "mars"
        human = subprocess.run([sys.executable, "-m", "reach_cli", "explain", done.task_id],
                               env=settings_env(settings), cwd=ROOT, capture_output=True, text=True,
                               timeout=30)
        assert "last dispatch: to ex-eu" in human.stdout
