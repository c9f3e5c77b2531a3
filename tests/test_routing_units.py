"""The routing rules as pure functions: filters, scores, choice (no Redis)."""

from __future__ import annotations

import json
import math
import random
import time
from collections import Counter

import pytest

from broker import Settings
from broker.models import AgentDescriptor
from broker.protocol.health import SPEED_KNOWN, AgentHealth, parse_health
from broker.protocol.queue_score import decode as decode_queue_score
from broker.registry import AgentRecord
from broker.versions import satisfies
from dispatcher.context import DispatcherContext
from dispatcher.observations import Observations
from dispatcher.routing import (
    RECHECK_MS,
    Candidate,
    InboxLoad,
    ReadyTask,
    RoutingRound,
    WeightedPool,
    components,
    gate,
    score,
    speed,
)

S = Settings.load(redis_url="redis://x")
NOW = 10_000_000


def agent(name: str, **kw: object) -> Candidate:
    c = Candidate(name, int(kw.pop("conc", 8)), InboxLoad(int(kw.pop("out", 0)), int(kw.pop("run", 0))))  # type: ignore[call-overload]
    for key, value in kw.items():
        setattr(c, key, value)
    return c


def shares(round_: RoutingRound, task: ReadyTask, n: int) -> Counter[str]:
    out: Counter[str] = Counter()
    for _ in range(n):
        choice = round_.choose(task)
        if choice:
            out[choice.agent_id] += 1
    return out


def test_equal_agents_share_evenly_and_nobody_gets_argmax_hot() -> None:
    agents = [agent(f"a{i}", conc=1000, latency_p50_ms=1000.0) for i in range(4)]
    counts = shares(RoutingRound(agents, S, NOW, random.Random(3)), ReadyTask("t"), 2000)
    assert all(380 <= counts[f"a{i}"] <= 620 for i in range(4)), counts


def test_score_weights_and_slow_penalty() -> None:
    fast = agent("fast", latency_p50_ms=10.0, latency_baseline_ms=10.0, stability=1.0)
    fast.health.last_success_ms = NOW
    slow = agent("slow", latency_p50_ms=40.0, latency_baseline_ms=10.0, stability=1.0)
    parts_fast = components(fast, S, NOW, 10.0)
    parts_slow = components(slow, S, NOW, 10.0)
    assert score(parts_fast, S) == pytest.approx(100.0)  # idle, affine, fastest, stable
    assert parts_slow["penalty"] == 30.0 and parts_slow["latency"] == 0.25
    assert score(parts_slow, S) == pytest.approx(100 * (0.35 + 0.20 * 0.25 + 0.15) - 30)


def test_watermark_backlog_and_circuit_gates() -> None:
    assert gate(agent("a", conc=10, run=9, out=9), S, NOW, {})[0] == "watermark"
    assert gate(agent("a", conc=2, run=0, out=10), S, NOW, {})[0] == "backlog_full"
    broken = agent("b", health=AgentHealth(consecutive_failures=10, last_failure_ms=NOW - 1000))
    assert gate(broken, S, NOW, {})[0] == "circuit_open"
    later = NOW + S.circuit_open_ms
    assert gate(broken, S, later, {}) == (None, True)  # half-open: one probe
    assert gate(broken, S, later, {"b": later})[0] == "circuit_open:probe_out"
    healed = agent("b", health=AgentHealth(consecutive_failures=0, last_failure_ms=NOW - 1000))
    assert gate(healed, S, NOW, {}) == (None, False)


def test_half_open_agent_gets_exactly_one_probe() -> None:
    broken = agent("b", health=AgentHealth(consecutive_failures=10, last_failure_ms=NOW - 60_000))
    probes: dict[str, int] = {}
    round_ = RoutingRound([broken], S, NOW, random.Random(1), probes)
    first = round_.choose(ReadyTask("1"))
    assert first is not None and first.why == "probe" and probes == {"b": NOW}
    assert round_.choose(ReadyTask("2")) is None
    assert RoutingRound([broken], S, NOW + 10, random.Random(1), probes).choose(ReadyTask("3")) is None


def test_latency_ejection_after_five_slow_tasks() -> None:
    s = Settings.load(redis_url="redis://x", latency_ceiling_ms=100)
    slow = agent("s", health=AgentHealth(consecutive_slow=5, last_slow_ms=NOW - 10))
    assert gate(slow, s, NOW, {})[0] == "ejected_slow"
    assert gate(agent("s", health=AgentHealth(consecutive_slow=4, last_slow_ms=NOW)), s, NOW, {})[0] is None
    assert gate(slow, s, NOW + s.eject_ms, {}) == (None, True)


def test_region_strict_and_preferred() -> None:
    eu, us = agent("eu", region="eu"), agent("us", region="us")
    round_ = RoutingRound([eu, us], S, NOW, random.Random(2))
    assert set(shares(round_, ReadyTask("t", region="eu"), 10)) == {"eu"}
    assert round_.choose(ReadyTask("t", region="ap")) is None
    assert shares(round_, ReadyTask("t", region="ap", region_strict=False), 4)
    busy_eu = agent("eu", region="eu", conc=1, run=1, out=1)
    round_ = RoutingRound([busy_eu, agent("us", region="us")], S, NOW, random.Random(2))
    assert round_.choose(ReadyTask("t", region="eu", region_strict=False)) is None  # waits for eu


def test_version_constraints() -> None:
    round_ = RoutingRound([agent("v1", version="1.9"), agent("v2", version="2.4")], S, NOW, random.Random(1))
    assert set(shares(round_, ReadyTask("t", version=">=2"), 8)) == {"v2"}
    assert satisfies("2.10", ">=2.9") and not satisfies("2.3", "<2.3") and satisfies("2.3.4", "~=2.3")


def test_session_sticks_while_it_can_and_moves_when_not() -> None:
    a, b = agent("a"), agent("b")
    round_ = RoutingRound([a, b], S, NOW, random.Random(1))
    picks = {round_.choose(ReadyTask(str(i), session_id="s", session_agent="a")).agent_id for i in range(5)}  # type: ignore[union-attr]
    assert picks == {"a"}
    round_ = RoutingRound([b], S, NOW, random.Random(1), filtered={"a": "state:suspect"})
    moved = round_.choose(ReadyTask("x", session_id="s", session_agent="a"))
    assert moved is not None and moved.agent_id == "b"


def test_cold_agents_take_only_low_priority_unless_nobody_else_can() -> None:
    cold = agent("cold", recovered_at_ms=NOW - 1000)
    warm = agent("warm")
    round_ = RoutingRound([cold, warm], S, NOW, random.Random(4))
    assert set(shares(round_, ReadyTask("t", priority=8), 6)) == {"warm"}
    low = shares(RoutingRound([cold, warm], S, NOW, random.Random(4)), ReadyTask("t", priority=1), 12)
    assert "cold" in low
    alone = RoutingRound([agent("cold", recovered_at_ms=NOW - 1000)], S, NOW, random.Random(4))
    only = alone.choose(ReadyTask("t", priority=9))
    assert only is not None and only.why.endswith("cold_only")
    past = RoutingRound([agent("cold", recovered_at_ms=NOW - S.cold_start_ms)], S, NOW)
    assert past.choose(ReadyTask("t", priority=9)) is not None


def test_retry_avoids_the_last_agent_when_it_can() -> None:
    round_ = RoutingRound([agent("a"), agent("b")], S, NOW, random.Random(9))
    assert set(shares(round_, ReadyTask("t", last_agent_id="a"), 5)) == {"b"}
    lonely = RoutingRound([agent("a")], S, NOW, random.Random(9))
    assert lonely.choose(ReadyTask("t", last_agent_id="a")) is not None


def test_weighted_pool_samples_by_weight() -> None:
    pool = WeightedPool([1.0, 0.0, 3.0])
    rng = random.Random(0)
    counts = Counter(pool.sample(rng) for _ in range(4000))
    assert counts[1] == 0 and 2700 <= counts[2] <= 3300
    pool.set(2, 0.0)
    assert {pool.sample(rng) for _ in range(50)} == {0}
    assert WeightedPool([0.0]).sample(rng) is None


def test_health_hash_parsing() -> None:
    parsed = parse_health({"cf:a": "3", "lf:a": "17", "ok:b": "9", "cs:a": "1", "junk": "x"})
    assert parsed["a"].consecutive_failures == 3 and parsed["a"].last_failure_ms == 17
    assert parsed["b"].last_success_ms == 9


def test_snapshot_lists_candidates_and_filters() -> None:
    round_ = RoutingRound([agent("a")], S, NOW, filtered={"b": "state:suspect"})
    snap = round_.snapshot()
    assert snap["candidates"][0]["agent_id"] == "a" and snap["filtered"] == {"state:suspect": ["b"]}


@pytest.mark.parametrize("priority", range(10))
@pytest.mark.parametrize("constrained", [False, True])
def test_a_queue_score_carries_priority_and_constraints_in_its_fraction(priority: int,
                                                                      constrained: bool) -> None:
    # The layout of queue_score in broker/lua/_queue.lua, at today's and at a far later clock.
    for now in (1_764_000_000_000, 4_000_000_000_000):
        frac = (priority + 1) / 16 + (1 / 32 if constrained else 0)
        score = float(f"{now - priority * S.aging_ms + frac:.5f}")
        assert decode_queue_score(score) == (priority, constrained)
        assert math.floor(score) == now - priority * S.aging_ms  # ordering is the integer part


def test_grants_follow_the_weights_leave_loads_alone_and_put_a_probe_first() -> None:
    busy = agent("busy", out=6, run=6, latency_p50_ms=5.0)
    idle = agent("idle", latency_p50_ms=5.0)
    cold = agent("cold", latency_p50_ms=5.0, recovered_at_ms=NOW - 1000)
    flaky = agent("flaky", latency_p50_ms=5.0)
    flaky.health = AgentHealth(consecutive_failures=S.circuit_failures,
                               last_failure_ms=NOW - S.circuit_open_ms - 1)
    round_ = RoutingRound([busy, idle, cold, flaky], S, NOW, random.Random(5))
    rooms = dict(zip([c.agent_id for c in round_.agents], round_.rooms, strict=True))
    grants = round_.grants(1000)
    assert grants[0][0].agent_id == "flaky"  # the one probe it may have goes first
    per_agent = Counter(choice.agent_id for choice, _ in grants)
    assert per_agent == Counter({k: v for k, v in rooms.items() if v > 0})  # exactly the room
    assert {choice.agent_id for choice, low in grants if low} == {"cold"}  # cold: low priority only
    assert (busy.load.outstanding, idle.load.outstanding) == (6, 0)  # promises, not deliveries
    assert round_.grants(1000) == []  # the room is spent


@pytest.mark.parametrize(("held", "seen"), [(None, 8), (3, 5), (8, 1), (-4, 8), (1e300, 1), ("x", 8)])
def test_slots_held_by_handlers_past_their_timeout_are_left_out_of_an_agents_concurrency(
    held: object, seen: int
) -> None:
    settings = Settings.load(redis_url="redis://unused:1/0", prefix="held")
    ctx = DispatcherContext.connect(settings)
    now = int(time.time() * 1000)
    ctx.view._offset_ms = now - time.monotonic() * 1000
    stats: dict[str, object] = {"inflight": 0, "max_concurrency": 8}
    if held is not None:
        stats["held_slots"] = held
    record = AgentRecord.from_hash({
        "agent_id": "a1", "last_seen": str(now), "registered_at": str(now), "warm_until": str(now),
        "mode": "active", "stats": json.dumps(stats),
        "descriptor": AgentDescriptor(agent_id="a1", capabilities=["cap"],
                                      max_concurrency=8).model_dump_json(),
    })
    assert record is not None
    ctx.view.agents = {"a1": record}
    (candidate,), _ = Observations(ctx, "cap").candidates()
    assert candidate.max_concurrency == seen


def test_the_speed_completions_told_counts_only_while_they_keep_telling_it() -> None:
    # Completions that change nothing but the load are quiet (complete.lua), so the speed the
    # wake-ups told can be old: after two heartbeats without a word, routing goes by the
    # heartbeat's latency (an agent whose tasks turned slow must not keep a fast prefetch).
    settings = Settings.load(redis_url="redis://unused:1/0", prefix="speed", heartbeat_ms=5000)
    loop = Observations(DispatcherContext.connect(settings), "cap")
    assert loop.recent_speed("a1", time.monotonic()) is None
    loop.note_speed("a1", 4, 8.0)
    loop.note_speed("a1", 1, 12.0)
    now = time.monotonic()
    assert loop.recent_speed("a1", now) == pytest.approx(0.8 * 2.0 + 0.2 * 12.0)
    assert loop.recent_speed("a1", now + 9.9) is not None
    assert loop.recent_speed("a1", now + 10.1) is None
    loop.note_speed("a1", 0, 5.0)  # (a malformed wake-up is no news)
    assert loop.recent_speed("a1", now + 10.1) is None
    # A speed told again after that starts afresh: the old one is no part of it.
    loop.note_speed("a1", 2, 9000.0, now + 10.1)
    assert loop.recent_speed("a1", now + 10.1) == pytest.approx(4500.0)
    loop.note_speed("a1", 1, 500.0, now + 11.0)
    assert loop.recent_speed("a1", now + 11.0) == pytest.approx(0.8 * 4500.0 + 0.2 * 500.0)


def told(name: str, ms: float, conc: int = 4, samples: int = 50, **kw: object) -> Candidate:
    """An agent whose completions told its speed (p50 40 ms: the heartbeat's stale figure)."""
    health = AgentHealth(speed_ms=ms, speed_samples=samples, last_success_ms=NOW)
    return agent(name, conc=conc, latency_p50_ms=40.0, health=health, **kw)


def slow_fleet(**slow: object) -> list[Candidate]:
    return [told(f"f{i}", 40.0) for i in range(3)] + [told("slow", 400.0, **slow)]


def test_an_agent_slower_than_the_fleet_gets_tasks_only_where_faster_ones_have_no_room() -> None:
    # Three agents at 40 ms a task, one at 400: the fast ones take their free slots first (no
    # prefetch: at 40 ms a task none finishes one per refill); then the slow one its free slots,
    # and only for tasks that waited in the queue twice as long as it is slower (2 x 360 ms);
    # then nobody.
    round_ = RoutingRound(slow_fleet(out=1, run=1), S, NOW, random.Random(7))
    assert round_.fleet_ms == 40.0 and round_.rooms[round_.index["slow"]] == 3
    picks = [round_.choose(ReadyTask(f"t{i}", ready_at_ms=NOW - 5)) for i in range(14)]
    assert Counter(p.agent_id for p in picks[:12] if p) == Counter({"f0": 4, "f1": 4, "f2": 4})
    assert picks[12:] == [None, None]  # (better to wait for a fast agent's next free slot)
    # And the round stops reading there: the tasks behind waited less (a deep queue is not
    # read to its end for the slow agent's free slots).
    assert round_.capacity == 0 and round_.rooms[round_.index["slow"]] == 3
    assert round_.choose(ReadyTask("w", ready_at_ms=NOW - 719)) is None
    waited = [round_.choose(ReadyTask(f"w{i}", ready_at_ms=NOW - 720)) for i in range(4)]
    assert [(p.agent_id, p.why) for p in waited if p] == [("slow", "weighted:slow_only")] * 3
    assert waited[3] is None
    # A task only slow agents could ever take (its region's only agent) goes at once; one
    # that a faster agent of its region, full now, could take waits as a plain one does.
    eu = ReadyTask("c", region="eu", ready_at_ms=NOW)
    choice = RoutingRound(slow_fleet(region="eu"), S, NOW).choose(eu)
    assert choice is not None and choice.why == "weighted:slow_only"
    busy_eu = told("f3", 40.0, out=6, run=4, region="eu")
    assert RoutingRound([*slow_fleet(region="eu"), busy_eu], S, NOW).choose(eu) is None
    # Likewise a plain task when every faster agent is out (circuits open): at once.
    out = slow_fleet()
    for c in out[:3]:
        c.health.consecutive_failures, c.health.last_failure_ms = S.circuit_failures, NOW
    choice = RoutingRound(out, S, NOW).choose(ReadyTask("p", ready_at_ms=NOW))
    assert choice is not None and choice.agent_id == "slow"
    snap = RoutingRound(slow_fleet(), S, NOW).snapshot()
    slow_row = next(c for c in snap["candidates"] if c["agent_id"] == "slow")
    assert slow_row["slow"] is True and slow_row["penalty"] == S.slow_penalty
    assert snap["fleet_speed_ms"] == 40.0


def test_an_agent_finishing_less_than_a_task_per_refill_gets_no_task_behind_a_busy_slot() -> None:
    # Agents at 40 ms a task, 4 slots: none finishes a task within a refill (2 ms), so none is
    # given more than its free slots, by a round or a grant. A task that finds no free slot
    # stays in the queue, where the fleet's next completion pulls it: in a busy agent's inbox
    # it would wait for that agent's next free slot, four times as long in this fleet.
    def fleet() -> list[Candidate]:
        return [told(f"a{i}", 40.0, out=o, run=o) for i, o in enumerate((0, 1, 3, 4))]

    round_ = RoutingRound(fleet(), S, NOW, random.Random(5))
    assert "a3" not in round_.index and round_.filtered["a3"] == "watermark"
    picks = [round_.choose(ReadyTask(f"t{i}", ready_at_ms=NOW)) for i in range(10)]
    assert Counter(p.agent_id for p in picks if p) == Counter({"a0": 4, "a1": 3, "a2": 1})
    assert picks[8:] == [None, None] and round_.capacity == 0
    grants = RoutingRound(fleet(), S, NOW, random.Random(5)).grants(1000)
    assert Counter(c.agent_id for c, _ in grants) == Counter({"a0": 4, "a1": 3, "a2": 1})
    # Every one of them pulls, the full one too: that is how the queued task reaches a slot.
    assert sorted(c.agent_id for c, _ in round_.pulls()) == ["a0", "a1", "a2", "a3"]


def test_a_slow_agent_gets_no_grant_or_pull_while_a_faster_one_has_room() -> None:
    round_ = RoutingRound(slow_fleet(out=1, run=1), S, NOW, random.Random(3))
    assert {c.agent_id for c, _ in round_.grants(1000)} == {"f0", "f1", "f2"}
    assert "slow" not in {c.agent_id for c, _ in round_.pulls()}
    # The fast agents full (every slot running, their refill allowance unread): still no grant
    # for the slow one (a grant is for a task that has not waited at all).
    full = [told(f"f{i}", 40.0, out=6, run=4) for i in range(3)] + [told("slow", 400.0, out=1, run=1)]
    round_ = RoutingRound(full, S, NOW, random.Random(3))
    assert round_.grants(1000) == [] and round_.rooms == [3]
    assert [c.agent_id for c, _ in round_.pulls()] == ["f0", "f1", "f2"]


def test_a_slow_agent_holding_nothing_is_measured_again_after_a_while() -> None:
    # Idle since its last success RECHECK_MS ago (or as long as its own time per task, if
    # longer): one task, as any agent would get it (so an agent that recovered shows it);
    # before that, or while it holds a task, only overflow.
    for slow_ms, since, expect in ((400.0, RECHECK_MS - 1, 0), (400.0, RECHECK_MS, 1),
                                   (4000.0, RECHECK_MS, 0), (4000.0, 4000, 1)):
        fleet = slow_fleet()
        fleet[-1].health.speed_ms = slow_ms
        fleet[-1].health.last_success_ms = NOW - since
        round_ = RoutingRound(fleet, S, NOW, random.Random(1))
        picks = [round_.choose(ReadyTask(f"t{i}", ready_at_ms=NOW)) for i in range(18 + expect)]
        assert sum(1 for p in picks if p and p.agent_id == "slow") == expect
        assert round_.choose(ReadyTask("next", ready_at_ms=NOW)) is None


def test_who_is_slower_than_the_fleet() -> None:
    def slow_ones(*agents: Candidate) -> set[str]:
        return RoutingRound(list(agents), S, NOW).slow_ids

    # (Of two, the slow one is: the lower median. Speeds not yet known are no part of it.)
    assert slow_ones(told("a", 40.0), told("b", 400.0)) == {"b"}
    assert slow_ones(told("a", 40.0)) == set()
    assert slow_ones(told("a", 400.0), told("b", 400.0), told("c", 40.0, samples=2)) == set()
    assert slow_ones(told("a", 40.0), told("b", 400.0, samples=SPEED_KNOWN - 1)) == set()
    # Most of a fleet slow: the lower median is a fast agent's, so the slow ones are slow.
    assert slow_ones(told("a", 40.0), told("b", 40.0), told("c", 400.0), told("d", 400.0)) == {"c", "d"}
    # Under the floor, milliseconds are noise: 25 ms against a fleet of 2 ms is not slow.
    assert slow_ones(told("a", 2.0), told("b", 2.0), told("c", 25.0)) == set()
    assert slow_ones(told("a", 2.0), told("b", 2.0), told("c", 31.0)) == {"c"}
    # Slower than the fleet by less than slow_factor: not slow (its score says it).
    assert slow_ones(told("a", 40.0), told("b", 40.0), told("c", 110.0)) == set()


def test_the_told_speed_beats_the_heartbeats_stale_p50_in_the_score() -> None:
    # The heartbeat still says 40 ms (and a 40 ms baseline); the completions say 400.
    slow = told("slow", 400.0, latency_baseline_ms=40.0)
    parts = components(slow, S, NOW, 40.0)
    assert parts["latency"] == pytest.approx(0.1) and parts["penalty"] == S.slow_penalty
    fresh = told("fresh", 40.0, samples=SPEED_KNOWN - 1, latency_baseline_ms=40.0)
    assert speed(fresh) == 40.0 and components(fresh, S, NOW, 40.0)["penalty"] == 0.0
    # (A no-op agent's speed is floored at 10 ms: against a 0 ms baseline that is no slowness.)
    noop = told("noop", 10.0, latency_baseline_ms=0.0)
    assert components(noop, S, NOW, 10.0)["penalty"] == 0.0


def test_a_told_speed_is_news_when_it_becomes_known_or_moves_far() -> None:
    loop = Observations(DispatcherContext.connect(Settings.load(redis_url="redis://unused:1/0")), "cap")
    assert loop.note_told_speed("a", 40.0, SPEED_KNOWN - 1) is False  # (not judged yet)
    assert loop.note_told_speed("a", 41.0, SPEED_KNOWN) is True  # known now
    assert loop.note_told_speed("a", 50.0, 20) is False
    assert loop.note_told_speed("a", 75.0, 21) is True  # 1.5 x
    assert loop.note_told_speed("a", 60.0, 22) is False
    assert loop.note_told_speed("a", 39.0, 23) is True
    assert loop.health["a"].speed_ms == 39.0 and loop.health["a"].speed_samples == 23


def test_a_weighted_pool_built_at_once_is_the_one_built_by_setting_each_weight() -> None:
    rng = random.Random(11)
    for n in (0, 1, 2, 3, 7, 8, 9, 100):
        weights = [rng.choice([0.0, 1.0, rng.uniform(0, 100)]) for _ in range(n)]
        built = WeightedPool(weights)
        stepwise = WeightedPool([0.0] * n)
        for i, w in enumerate(weights):
            stepwise.set(i, w)
        assert built.tree == pytest.approx(stepwise.tree) and built.positive == stepwise.positive
        assert built.total() == pytest.approx(sum(weights))


def test_grants_fill_free_slots_before_any_agents_prefetch() -> None:
    # Submits take grants in order: a task in a free slot starts at once, one in a prefetch
    # slot waits for that agent's next finished task, so every free slot comes first.
    # (Agents fast enough for a prefetch: 1 ms a task, 4 x 2 ms refill / 1 ms = 8 each.)
    agents = [agent(f"a{i}", conc=4, out=o, run=o, latency_p50_ms=1.0) for i, o in enumerate((0, 2, 4))]
    free = {"a0": 4, "a1": 2, "a2": 0}
    for seed in range(20):
        fresh = [agent(a.agent_id, conc=4, out=a.load.outstanding, run=a.load.running,
                       latency_p50_ms=1.0) for a in agents]
        grants = [c.agent_id for c, _ in RoutingRound(fresh, S, NOW, random.Random(seed)).grants(1000)]
        head = Counter(grants[:sum(free.values())])
        assert head == Counter({k: v for k, v in free.items() if v}), (seed, grants)
        assert len(grants) > sum(free.values())  # (and then their prefetch)
