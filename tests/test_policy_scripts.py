"""The policy where it is applied: in the scripts that start tasks (dispatch, a submit's hand-off
by grant, a completion's standing pull) and decide retries, atomically, on every Redis target
(the Cluster too: every key a script touches is in its capability's slot)."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from broker import ReachClient, SubmitOptions
from broker.ids import split_task_id
from broker.keys import STAT_REMOVED, CapabilityKeys
from broker.ops import policy as policies
from broker.protocol.counters import parse_counters
from broker.protocol.delivery import (
    HOLD_AT_MAX_RUNNING,
    HOLD_PAUSED,
    AgentBatch,
    dispatch_call,
    parse_dispatch,
)
from broker.protocol.grants import pulls_call
from broker.protocol.policy import active_sync_call
from broker.scripts import Scripts
from broker.settings import Settings
from tests.test_handoff import bind, finish_read, grant, parsed_pulls, record


def set_policy(r: redis.Redis, settings: Settings, capability: str | None, **fields: Any) -> None:
    policies.set_fields(r, Scripts(r), settings, capability, fields, who="test")


def dispatch(r: redis.Redis, settings: Settings, capability: str, agent: str, *task_ids: str) -> Any:
    return parse_dispatch(Scripts(r)(dispatch_call(settings, capability, [AgentBatch(
        agent, 40, [split_task_id(t)[1] for t in task_ids])])), 1)


def test_a_paused_capability_starts_nothing_by_any_path_and_resumes(
    client: ReachClient, settings: Settings, r: redis.Redis, prefix: str
) -> None:
    cap = "paused"
    ck = CapabilityKeys(prefix, cap)
    bind(r, settings, cap, "a1")
    set_policy(r, settings, cap, paused=True, paused_reason="upstream down")
    # A dispatch round's hand-off: nothing, and the reply says why.
    queued = [client.submit(cap, {"n": i}) for i in range(3)]
    reply = dispatch(r, settings, cap, "a1", *[h.task_id for h in queued])
    assert reply.hold == HOLD_PAUSED and reply.results[0].dispatched == 0 and r.zcard(ck.queue) == 3
    # A submit's hand-off by grant, with the queue empty and a grant standing: it queues.
    r.delete(ck.queue)
    grant(r, settings, cap, "a1|40|round-1|50|")
    by_grant = client.submit(cap, {"n": 3})
    assert by_grant.status().state == "queued" and r.llen(ck.grants) == 1
    # A completion's standing pull, with tasks queued: it takes none.
    set_policy(r, settings, cap, paused=False)
    dispatch(r, settings, cap, "a1", by_grant.task_id)
    set_policy(r, settings, cap, paused=True)
    Scripts(r)(pulls_call(settings, cap, parsed_pulls({"a1": "40|round-p|50|"}), 60_000))
    more = [client.submit(cap, {"n": i}) for i in range(4, 7)]
    assert finish_read(r, settings, cap, "a1").pulled == 0
    assert all(h.status().state == "queued" for h in more)
    # Resumed: the same paths start tasks again.
    set_policy(r, settings, cap, paused=False)
    reply = dispatch(r, settings, cap, "a1", more[0].task_id)
    assert reply.hold == 0 and reply.results[0].dispatched == 1
    assert finish_read(r, settings, cap, "a1").pulled == 1  # (one per slot freed)


def test_the_rate_is_a_token_bucket_for_every_start(client: ReachClient, settings: Settings,
                                                    r: redis.Redis, prefix: str) -> None:
    cap = "rated"
    bind(r, settings, cap, "a1")
    set_policy(r, settings, cap, rate=2.0, burst=3)
    first = client.submit(cap, {"n": 0})
    dispatch(r, settings, cap, "a1", first.task_id)  # (one token)
    # Tokens taken for tasks that do not start (taken already) are given back.
    assert dispatch(r, settings, cap, "a1", first.task_id).results[0].taken == 1
    handles = [client.submit(cap, {"n": i}) for i in range(1, 6)]
    reply = dispatch(r, settings, cap, "a1", *[h.task_id for h in handles])
    # Two tokens are left of the three: two start, the rest wait (one token every 500 ms).
    assert reply.results[0].dispatched == 2 and reply.results[0].left == 3
    assert 0 < reply.hold <= 500
    assert dispatch(r, settings, cap, "a1", handles[2].task_id).results[0].dispatched == 0


def test_max_running_holds_handed_out_tasks_and_the_count_stays_exact(
    client: ReachClient, settings: Settings, r: redis.Redis, prefix: str
) -> None:
    cap = "capped"
    ck = CapabilityKeys(prefix, cap)
    bind(r, settings, cap, "a1")
    set_policy(r, settings, cap, max_running=2)
    handles = [client.submit(cap, {"n": i}) for i in range(5)]
    reply = dispatch(r, settings, cap, "a1", *[h.task_id for h in handles])
    assert reply.results[0].dispatched == 2 and reply.hold == HOLD_AT_MAX_RUNNING
    assert active(r, ck) == 2
    # The two end; their completion pulls no more than the cap allows.
    Scripts(r)(pulls_call(settings, cap, parsed_pulls({"a1": "40|round-p|50|"}), 60_000))
    done = finish_read(r, settings, cap, "a1")
    assert done.statuses == ("ok", "ok") and done.pulled == 2 and active(r, ck) == 2
    # A cancel of an unread one gives its place back; the sweep's exact count agrees.
    unread = [h for h in handles if h.status().state == "dispatched"]
    assert unread and client.cancel(unread[0].task_id)
    assert active(r, ck) == 1
    assert Scripts(r)(active_sync_call(settings, cap)) == 1 and active(r, ck) == 1
    # A count gone wrong (a crash between two scripts cannot do it, an operator can) is set
    # right by the sweep's exact count.
    r.hincrby(ck.stats, STAT_REMOVED, 5)
    assert active(r, ck) == -4
    assert Scripts(r)(active_sync_call(settings, cap)) == 1 and active(r, ck) == 1


def active(r: redis.Redis, ck: CapabilityKeys) -> int:
    return parse_counters(r.hgetall(ck.stats)).active


def test_lowering_max_attempts_stops_the_retries_of_tasks_already_queued(
    client: ReachClient, settings: Settings, r: redis.Redis, prefix: str
) -> None:
    cap = "attempts"
    bind(r, settings, cap, "a1")
    set_policy(r, settings, cap, max_attempts=5)
    plain, own = client.submit(cap, {"n": 0}), client.submit(cap, {"n": 1}, max_attempts=5)
    dispatch(r, settings, cap, "a1", plain.task_id, own.task_id)
    set_policy(r, settings, cap, max_attempts=1)
    finish_read(r, settings, cap, "a1", outcome="retryable_failure")
    # The policy decides when the failure is reported; a task's own limit still wins.
    assert plain.status().state == "failed" and plain.status().reason == "retries_exhausted"
    assert own.status().state == "retrying"


def test_a_scheduled_task_waits_in_the_delayed_set(
    client: ReachClient, settings: Settings, r: redis.Redis, prefix: str
) -> None:
    cap = "later"
    ck = CapabilityKeys(prefix, cap)
    handle = client.submit(cap, {"n": 0}, SubmitOptions(delay_s=60))
    status = handle.status()
    assert status.state == "scheduled" and status.due_at is not None
    assert r.zcard(ck.queue) == 0 and r.zscore(ck.delayed, split_task_id(handle.task_id)[1])
    assert record(r, prefix, handle.task_id)["e:1"].startswith("scheduled|")
    assert r.zcard(ck.deadlines) == 0  # (no deadline given: nothing to look at)
    assert client.cancel(handle.task_id) and handle.status().state == "canceled"
    assert r.zcard(ck.delayed) == 0


@pytest.mark.parametrize("scope", ["capability", "fleet"])
def test_policy_changes_are_recorded_and_read_back_with_their_source(
    client: ReachClient, settings: Settings, r: redis.Redis, scope: str
) -> None:
    cap = "provenance"
    target = cap if scope == "capability" else None
    changes = client.set_policy(target, who="ops@host", max_attempts=4, aging_ms=500)
    assert {(c.field, c.new) for c in changes} == {("max_attempts", "4"), ("aging_ms", "500")}
    policy = client.policy(cap)
    assert policy["max_attempts"] == 4 and policy.sources["max_attempts"].by == "ops@host"
    assert policy.sources["max_attempts"].describe().startswith("set by ops@host")
    assert policy["rate"] == 0 and policy.sources["rate"].kind == "default"
    assert client.set_policy(target, max_attempts=4) == []  # (no change, no history)
    client.reset_policy(target, "max_attempts")
    assert client.policy(cap)["max_attempts"] == settings.max_attempts
    history = client.policy_history(target)
    assert [(h["field"], h["change"]) for h in history][:3] == [
        ("max_attempts", "reset"), ("aging_ms", "set"), ("max_attempts", "set")]
    assert client.reset_policy(target) and all(
        client.policy(cap).sources[name].kind == "default" for name in ("max_attempts", "aging_ms"))


def test_bad_policy_values_are_refused_before_anything_is_written(
    client: ReachClient, settings: Settings, r: redis.Redis
) -> None:
    for fields in ({"max_attempts": 0}, {"rate": -1.0}, {"max_running": -2}, {"timeout_ms": 0},
                   {"paused": "yes"}, {"aging_ms": float("nan")}, {"max_attempts": 2.5}, {"nope": 1}):
        with pytest.raises(ValueError):
            client.set_policy("badvalues", **fields)
    assert client.policy_history("badvalues") == []
