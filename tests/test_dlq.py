"""The dead-letter tools (`dlq_tools`, `reach dlq`): list, show, stats, replay, purge, export and
import, retention, and what bad arguments get.

Tasks reach the DLQ for real: through worker processes (tests.dlq_handlers:switchable, whose
failure a test switches off to "fix the cause"), or, where processes add nothing, by driving
the worker's own scripts (bind, dispatch, accept, complete) from the test.
"""

from __future__ import annotations

import hashlib
import json
import logging
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from typer.testing import CliRunner

import dlq_tools
from broker import BadInput, ReachClient, Settings, TaskFailed, TaskHandle
from broker.client.events import read_events
from broker.keys import AGENT_GROUP, DISPATCH_GROUP, CapabilityKeys, RegistryKeys
from broker.protocol.agents import bind_call
from broker.protocol.delivery import AgentBatch, Lease, accept_call, dispatch_call
from broker.protocol.lifecycle import dead_letter_raw_call
from broker.protocol.reports import Completion, complete_call
from broker.registry import server_ms
from broker.scripts import Scripts
from dlq_tools import DeadLetters, Filter, Pacer, ReplayOptions, attempts_from_history
from dlq_tools.parsing import parse_duration_ms, parse_ref, parse_time_ms
from reach_cli.main import app
from tests.conftest import ROOT, Fleet, settings_env, wait_until
from tests.dlq_handlers import set_broken
from tests.handlers import runs

SWITCHABLE = "tests.dlq_handlers:switchable"
CONTRACT = ["task_id", "capability", "reason", "attempts", "error", "dead_at", "last_agent_id"]


# -- helpers -----------------------------------------------------------------------------------

def dlq(settings: Settings, *args: str) -> Any:
    """Run `reach dlq ARGS` in-process; returns click's Result (stdout, stderr, exit_code)."""
    return CliRunner().invoke(app, ["dlq", *args], env=settings_env(settings), catch_exceptions=False)


def dlq_json(settings: Settings, *args: str) -> Any:
    done = dlq(settings, *args, "--json")
    assert done.exit_code == 0, done.stderr
    return json.loads(done.stdout)


def fail_directly(settings: Settings, client: ReachClient, capability: str,
                  tasks: list[tuple[Any, str, str]], agent: str = "agent-t") -> list[TaskHandle]:
    """Fail tasks through the worker's own scripts: (payload, outcome, error text) each.

    Tasks with outcome retryable_failure get max_attempts=1, so they end retries_exhausted.
    """
    r = client._redis
    scripts = Scripts(r)
    token = "token-" + agent
    scripts(bind_call(settings, capability, agent, hashlib.sha1(token.encode()).hexdigest()))
    handles = [client.submit(capability, payload,
                             max_attempts=1 if outcome == "retryable_failure" else None)
               for payload, outcome, _ in tasks]
    locals_ = [h.task_id.split(":")[1] for h in handles]
    scripts(dispatch_call(settings, capability, [AgentBatch(agent, 10**6, locals_)]))
    ck = CapabilityKeys(settings.prefix, capability)
    read = r.xreadgroup(AGENT_GROUP, agent, {ck.inbox(agent): ">"}, count=len(tasks))[0][1]
    deliveries = [Lease(entry_id, f["id"], f["fence"]) for entry_id, f in read]
    scripts(accept_call(settings, capability, agent, token, deliveries))
    by_local = {d.local_id: d for d in deliveries}
    done = [Completion(by_local[local].entry_id, local, by_local[local].fence, outcome, error, 0, 3)
            for local, (_, outcome, error) in zip(locals_, tasks, strict=True)]
    scripts(complete_call(settings, capability, agent, token, done))
    return handles


def dead_letter_raw(settings: Settings, r: redis.Redis, capability: str, fields: dict[str, str]) -> None:
    """A malformed intake entry, parked the way the dispatcher parks it."""
    ck = CapabilityKeys(settings.prefix, capability)
    r.xgroup_create(ck.intake, DISPATCH_GROUP, id="0", mkstream=True)
    entry_id = r.xadd(ck.intake, fields)
    r.xreadgroup(DISPATCH_GROUP, "d1", {ck.intake: ">"})
    Scripts(r)(dead_letter_raw_call(settings, capability, ck.intake, DISPATCH_GROUP, entry_id,
                                             "malformed", "no payload field", fields))


def dlq_task_ids(settings: Settings, capability: str) -> list[str]:
    with DeadLetters(settings) as d:
        return [t.task_id or t.entry for t in d.select(f=Filter(capability=capability))]


def server_now(r: redis.Redis) -> int:
    return server_ms(r.time())


def one_line_error(done: Any) -> str:
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return str(lines[0])


# -- pure logic ----------------------------------------------------------------------------

def test_public_api_is_declared() -> None:
    assert sorted(dlq_tools.__all__) == sorted(set(dlq_tools.__all__))
    for name in dlq_tools.__all__:
        assert hasattr(dlq_tools, name), name
    for name in ("DeadLetters", "Filter", "ReplayOptions", "trim", "UnknownDeadLetter"):
        assert name in dlq_tools.__all__
    for method in ("list", "get", "replay", "purge", "stats", "select", "export", "import_"):
        assert callable(getattr(DeadLetters, method))


def test_durations_times_and_ids_parse() -> None:
    assert parse_duration_ms("2h") == 7_200_000
    assert parse_duration_ms("1h30m") == 5_400_000
    assert parse_duration_ms("500ms") == 500 and parse_duration_ms("1.5s") == 1500
    assert parse_time_ms("7d", 10 * 86_400_000) == 3 * 86_400_000
    assert parse_time_ms("2024-05-01T12:00:00Z", 0) == 1_714_564_800_000
    assert parse_time_ms("2024-05-01T12:00:00", 0) == 1_714_564_800_000
    for bad in ("", "2", "soon", "3x", "-1h", "0s"):
        with pytest.raises(BadInput):
            parse_time_ms(bad, 0)
    ref = parse_ref("sum:01KZZZZZZZZZZZZZZZZZZZZZZZ")
    assert ref.capability == "sum" and ref.task_id and ref.entry_id is None
    ref = parse_ref("sum/1712345678901-3")
    assert ref.capability == "sum" and ref.entry_id == "1712345678901-3" and str(ref) == "sum/1712345678901-3"
    for bad in ("nope", "sum:short", "Sum/1-0", "sum/abc", "sum/1", "a:b:c",
                "sum/18446744073709551616-0", "sum/1-18446744073709551616",
                "sum/\u0661\u0662-0"):
        with pytest.raises(BadInput, match="invalid dead-letter id"):
            parse_ref(bad)


def test_attempts_are_read_back_from_the_history() -> None:
    def ev(kind: str, attempt: int, agent: str | None, t: int, **data: Any) -> dict[str, Any]:
        return {"type": kind, "attempt": attempt, "agent_id": agent, "time": t, "data": data}

    events = [
        ev("queued", 0, None, 1), ev("dispatched", 0, "a", 2), ev("accepted", 1, "a", 3),
        ev("retry_scheduled", 1, "a", 4, error="rate limit"), ev("dispatched", 1, "b", 5),
        ev("accepted", 2, "b", 6), ev("failed", 2, "b", 7, reason="retries_exhausted", error="again"),
        ev("dead_lettered", 2, "b", 7), ev("replayed", 0, None, 8, replay=1), ev("queued", 0, None, 8),
        ev("failed", 0, None, 9, reason="expired", error="deadline passed while queued"),
    ]
    got = attempts_from_history(events)
    assert [(a.replay, a.attempt, a.agent_id, a.outcome, a.error) for a in got] == [
        (0, 1, "a", "retryable_failure", "rate limit"),
        (0, 2, "b", "retries_exhausted", "again"),
        (1, 0, None, "expired", "deadline passed while queued"),
    ]
    assert got[1].dispatched_at_ms == 5 and got[1].started_at_ms == 6 and got[1].ended_at_ms == 7


def test_pacer_spaces_batches_to_the_rate() -> None:
    clock = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        clock[0] += s

    pacer = Pacer(10, clock=lambda: clock[0], sleep=sleep)
    for _ in range(5):
        pacer.wait(5)  # 25 items at 10/s: the first batch at once, then one every 0.5 s
    assert slept == pytest.approx([0.5, 0.5, 0.5, 0.5])
    with pytest.raises(BadInput):
        ReplayOptions(rate=0)
    with pytest.raises(BadInput, match="priority"):
        ReplayOptions(priority=10)


# -- failing for real, then inspecting ---------------------------------------------------------

def test_failures_of_every_kind_are_listed_filtered_shown_and_counted(
    settings: Settings, client: ReachClient, fleet: Fleet, r: redis.Redis, prefix: str,
) -> None:
    set_broken(r, prefix, True)
    # expired: its deadline passes before any agent serves the capability.
    late = client.submit("beta", {"n": 10}, deadline_s=0.05)
    deadline = int(r.hget(CapabilityKeys(prefix, "beta").task(late.task_id.split(":")[1]), "deadline_at"))
    wait_until(lambda: server_now(r) > deadline, message="deadline passed")
    fleet.dispatcher()
    worker = fleet.worker("alpha", "beta", handler=SWITCHABLE)
    handles = {how: client.submit("alpha", {"n": i, "how": how}, max_attempts=2)
               for i, how in enumerate(["failure", "invalid", "retry", "bad_result"])}
    ck = CapabilityKeys(prefix, "alpha")
    r.xadd(ck.intake, {"nopayload": "1"})  # malformed, from a producer that is not ours
    wait_until(lambda: r.xlen(ck.dlq) == 5 and r.xlen(CapabilityKeys(prefix, "beta").dlq) == 1,
               message="six dead letters")

    with DeadLetters(settings) as d:
        page = d.list()
        assert len(page.items) == 6 and page.next_before is None
        assert {x.reason for x in page.items} == {"failure", "invalid_request", "retries_exhausted",
                                                  "bad_result", "malformed", "expired"}
        keys = [(x.entry_id, x.capability) for x in page.items]
        assert keys == sorted(keys, key=lambda k: (tuple(map(int, k[0].split("-"))), k[1]), reverse=True)
        assert [x.task_id for x in d.list(Filter(reason="expired")).items] == [late.task_id]
        assert len(d.list(Filter(capability="alpha")).items) == 5
        by_agent = d.list(Filter(agent=worker.agent_id)).items
        assert {x.task_id for x in by_agent} == {h.task_id for h in handles.values()}
        assert len(d.list(Filter(since_ms=server_now(r) - 3_600_000)).items) == 6
        assert d.list(Filter(since_ms=server_now(r) + 60_000)).items == []

        detail = d.get(handles["retry"].task_id)
        assert detail.letter.reason == "retries_exhausted" and detail.letter.attempts == 2
        assert detail.payload() == {"n": 2, "how": "retry"}
        assert [(a.attempt, a.agent_id, a.outcome) for a in detail.attempt_history] == [
            (1, worker.agent_id, "retryable_failure"), (2, worker.agent_id, "retries_exhausted")]
        assert all(a.started_at_ms and a.ended_at_ms for a in detail.attempt_history)
        assert detail.record["trace"][3:35] == handles["retry"].status().trace_id
        assert d.get(handles["invalid"].task_id).letter.error == "InvalidRequest: task 1 lacks a field"
        malformed = d.list(Filter(reason="malformed")).items[0]
        assert malformed.task_id is None
        raw = d.get(malformed.entry)
        assert raw.raw == {"nopayload": "1"} and raw.letter.error == "no payload field"

        stats = d.stats()
        assert stats.total == 6
        assert {c.capability: dict(c.by_reason) for c in stats.capabilities} == {
            "alpha": {"failure": 1, "invalid_request": 1, "retries_exhausted": 1, "bad_result": 1,
                      "malformed": 1},
            "beta": {"expired": 1}}
        assert stats.oldest_ms <= stats.newest_ms

    listed = dlq_json(settings, "list")
    assert isinstance(listed, list) and len(listed) == 6
    assert all(list(item)[:7] == CONTRACT for item in listed)
    assert dlq_json(settings, "list", "--reason", "failure", "-c", "alpha")[0]["task_id"] == \
        handles["failure"].task_id
    assert len(dlq_json(settings, "list", "--agent", worker.agent_id or "", "--since", "1h")) == 4
    shown = dlq_json(settings, "show", handles["retry"].task_id)
    assert list(shown)[:7] == CONTRACT and shown["attempts"] == 2
    assert shown["trace_id"] and shown["payload"] == {"n": 2, "how": "retry"}
    assert [a["outcome"] for a in shown["attempt_history"]] == ["retryable_failure", "retries_exhausted"]
    assert [e["type"] for e in shown["events"]][-2:] == ["failed", "dead_lettered"]
    counted = dlq_json(settings, "stats")
    assert counted["total"] == 6 and counted["by_reason"]["expired"] == 1
    assert counted["top_errors"][0]["count"] >= 1
    text = dlq(settings, "list")
    assert text.exit_code == 0 and handles["failure"].task_id in text.stdout
    assert "retries_exhausted" in dlq(settings, "show", handles["retry"].task_id).stdout
    assert "alpha" in dlq(settings, "stats").stdout
    # Paging: two at a time, following --before, gives each dead letter once.
    seen: list[str] = []
    before: list[str] = []
    while True:
        page_items = dlq_json(settings, "list", "--limit", "2", *before)
        seen += [item["entry"] for item in page_items]
        if len(page_items) < 2:
            break
        before = ["--before", page_items[-1]["entry"]]
    assert sorted(seen) == sorted(item["entry"] for item in listed) and len(seen) == 6

    # An expired task gets its deadline budget again, counted from the replay.
    beta = CapabilityKeys(prefix, "beta")
    local = late.task_id.split(":")[1]
    budget = int(r.hget(beta.task(local), "deadline_at")) - int(r.hget(beta.task(local), "created_at"))
    with DeadLetters(settings) as d:
        assert d.replay(d.select([late.task_id])).counts() == {"replayed": 1}
    record = r.hgetall(beta.task(local))
    assert int(record["deadline_at"]) - int(record["queued_at"]) == budget
    wait_until(lambda: r.xlen(beta.dlq) == 1, message="expired again")
    # ... and the same budget at the next replay (not the time since its creation added).
    with DeadLetters(settings) as d:
        assert d.replay(d.select([late.task_id])).counts() == {"replayed": 1}
    record = r.hgetall(beta.task(local))
    assert int(record["deadline_at"]) - int(record["queued_at"]) == budget
    wait_until(lambda: r.xlen(beta.dlq) == 1, message="expired once more")


# -- replay ----------------------------------------------------------------------------------

def test_replay_after_the_fix_succeeds_and_leaves_the_dlq_and_dry_run_changes_nothing(
    settings: Settings, client: ReachClient, fleet: Fleet, r: redis.Redis, prefix: str,
) -> None:
    set_broken(r, prefix, True)
    fleet.dispatcher()
    fleet.worker("alpha", handler=SWITCHABLE)
    handles = [client.submit("alpha", {"n": i, "how": "failure"}) for i in range(3)]
    handles.append(client.submit("alpha", {"n": 3, "how": "retry"}, max_attempts=2))
    ck = CapabilityKeys(prefix, "alpha")
    wait_until(lambda: r.xlen(ck.dlq) == 4, message="four dead letters")
    before = r.xrange(ck.dlq)
    fences = {h.task_id: int(r.hget(ck.task(h.task_id.split(":")[1]), "fence")) for h in handles}

    preview = dlq_json(settings, "replay", "--all", "--dry-run")
    assert preview["dry_run"] is True and preview["counts"] == {"would_replay": 4}
    assert r.xrange(ck.dlq) == before and r.zcard(ck.queue) == 0
    assert all(h.status().state == "failed" for h in handles)
    assert not any(e.type == "replayed" for h in handles
                   for e in read_events(r, ck.task(h.task_id.split(":")[1]), h.task_id))

    set_broken(r, prefix, False)  # the operator fixes the cause
    done = dlq_json(settings, "replay", "--capability", "alpha", "--yes")
    assert done["counts"] == {"replayed": 4} and done["selected"] == 4
    assert r.xlen(ck.dlq) == 0
    for i, h in enumerate(handles):
        assert h.result(timeout=30) == {"n": i, "attempt": 1}  # a fresh attempt count
        types = [e.type for e in read_events(r, ck.task(h.task_id.split(":")[1]), h.task_id)]
        assert types.count("dead_lettered") == 1 and types.count("replayed") == 1
        assert types[-1] == "succeeded"
        assert int(r.hget(ck.task(h.task_id.split(":")[1]), "fence")) > fences[h.task_id]
    assert runs(r, prefix) == {"0": 2, "1": 2, "2": 2, "3": 3}
    assert dlq_json(settings, "list") == []


def test_replay_while_the_agent_still_fails_returns_to_the_dlq_with_history_kept(
    settings: Settings, client: ReachClient, fleet: Fleet, r: redis.Redis, prefix: str,
) -> None:
    set_broken(r, prefix, True)
    fleet.dispatcher()
    fleet.worker("alpha", handler=SWITCHABLE)
    h = client.submit("alpha", {"n": 1, "how": "retry"}, max_attempts=2)
    ck = CapabilityKeys(prefix, "alpha")
    wait_until(lambda: r.xlen(ck.dlq) == 1, message="dead letter")
    first = r.xrange(ck.dlq)[0][0]

    done = dlq(settings, "replay", h.task_id)  # named ids need no confirmation
    assert done.exit_code == 0, done.stderr
    wait_until(lambda: r.xlen(ck.dlq) == 1 and r.xrange(ck.dlq)[0][0] != first, message="dead again")
    with DeadLetters(settings) as d:
        again = d.get(h.task_id)
        assert [(a.replay, a.attempt, a.outcome) for a in again.attempt_history] == [
            (0, 1, "retryable_failure"), (0, 2, "retries_exhausted"),
            (1, 1, "retryable_failure"), (1, 2, "retries_exhausted")]
        types = [e["type"] for e in again.events]
        assert types.count("dead_lettered") == 2 and types.count("replayed") == 1
        replayed = next(e for e in again.events if e["type"] == "replayed")
        assert replayed["data"]["previous_reason"] == "retries_exhausted"
        assert replayed["data"]["previous_attempts"] == 2 and replayed["data"]["attempts_reset"] is True

        # --keep-attempts: one more try only, numbered after the last one.
        report = d.replay(d.select([h.task_id]), ReplayOptions(reset_attempts=False, priority=9))
        assert report.counts() == {"replayed": 1}
    wait_until(lambda: r.xlen(ck.dlq) == 1 and r.xrange(ck.dlq)[0][1]["attempts"] == "3",
               message="dead after one more try")
    with DeadLetters(settings) as d:
        last = d.get(h.task_id)
        assert [(a.replay, a.attempt) for a in last.attempt_history][-1] == (2, 3)
        assert last.envelope()["priority"] == 9
    assert runs(r, prefix) == {"1": 5}
    with pytest.raises(TaskFailed) as failed:
        h.result(timeout=1)
    assert failed.value.reason == "retries_exhausted"


def test_replay_killed_midway_loses_and_duplicates_nothing(
    settings: Settings, client: ReachClient, fleet: Fleet, r: redis.Redis, prefix: str,
) -> None:
    total = 150
    handles = fail_directly(settings, client, "kill",
                            [({"n": i}, "failure", f"broken {i}") for i in range(total)])
    ck = CapabilityKeys(prefix, "kill")
    assert r.xlen(ck.dlq) == total
    locals_ = {h.task_id.split(":")[1] for h in handles}
    argv = [sys.executable, "-m", "reach_cli", "dlq", "replay", "--all", "--yes", "--rate", "40",
            "--batch", "5", "--json"]
    proc = subprocess.Popen(argv, env=settings_env(settings), cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: r.xlen(ck.dlq) <= total - 30, timeout=30, message="replay under way")
        proc.kill()
    finally:
        proc.wait(10)
    in_dlq = [t.split(":")[1] for t in dlq_task_ids(settings, "kill")]
    queued = set(r.zrange(ck.queue, 0, -1))
    assert 0 < len(in_dlq) < total - 20, "the kill must land mid-way"
    assert len(in_dlq) == len(set(in_dlq)), "no dead letter twice"
    assert set(in_dlq).isdisjoint(queued), "nothing both queued and dead"
    assert set(in_dlq) | queued == locals_, "nothing lost"
    for local in locals_:
        state = r.hget(ck.task(local), "state")
        assert state == ("queued" if local in queued else "failed")

    with DeadLetters(settings) as d:  # run it again: exactly the rest is replayed
        report = d.replay(d.select(everything=True), ReplayOptions(rate=10_000, batch=50))
    assert report.counts() == {"replayed": len(in_dlq)}
    assert r.xlen(ck.dlq) == 0 and set(r.zrange(ck.queue, 0, -1)) == locals_
    # Their producer still holds the handles and blocks on the done lists without asking again:
    # the replay keeps the flag that has the outcome pushed there (without it, each result()
    # below waited out a whole 5 s block).
    assert {r.hget(ck.task(local), "d") for local in locals_} == {"1"}
    fleet.dispatcher()
    fleet.worker("kill", handler="tests.handlers:record", concurrency=16)
    for i, h in enumerate(handles):
        assert h.result(timeout=30) == {"n": i}  # (`record` echoes its payload)
    assert runs(r, prefix) == {str(i): 1 for i in range(total)}, "each task ran exactly once"


def test_replay_leaves_active_tasks_alone_and_stops_when_the_queue_is_full(
    make_settings: Callable[..., Settings], r: redis.Redis, prefix: str,
) -> None:
    settings = make_settings(max_queue_depth=3)
    ck = CapabilityKeys(prefix, "full")
    with ReachClient(settings) as client, DeadLetters(settings) as d:
        handles = [h for _ in range(2) for h in fail_directly(
            settings, client, "full", [({"n": i}, "invalid_request", "bad") for i in range(2)])]
        assert d.replay(d.select([handles[0].task_id])).counts() == {"replayed": 1}
        # An entry whose task is live again (say, imported twice) is left alone, entry and all.
        dup = r.xadd(ck.dlq, {**r.xrange(ck.dlq)[0][1], "task_id": handles[0].task_id})
        refs = [f"full/{dup}", *(h.task_id for h in handles[1:])]
        report = d.replay(d.select(refs), ReplayOptions(batch=1))
    assert [o.status for o in report.outcomes] == ["active", "replayed", "replayed", "full"]
    # A dead letter whose task record expired and whose own copy of it is unusable stays put.
    lost = "full:01KZZZZZZZZZZZZZZZZZZZZZZZ"
    bad = r.xadd(ck.dlq, {"task_id": lost, "reason": "failure", "error": "", "attempts": "1",
                          "last_agent_id": "", "dead_at": "1", "record": "not json", "history": "[]"})
    with DeadLetters(settings) as d:
        assert d.replay(d.select([f"full/{bad}"])).counts() == {"corrupt": 1}
    assert not r.exists(ck.task(lost.split(":")[1])) and r.xrange(ck.dlq, bad, bad)
    r.xdel(ck.dlq, bad)
    assert report.stopped and "full" in report.stopped
    assert r.zcard(ck.queue) == 3 and r.xlen(ck.dlq) == 2
    done = dlq(settings, "replay", "--all", "--yes")
    assert done.exit_code == 1 and "queue of 'full' is full" in one_line_error(done)
    assert r.xlen(ck.dlq) == 2


def test_purge_by_filter_by_id_and_dry_run(settings: Settings, client: ReachClient, r: redis.Redis,
                                           prefix: str) -> None:
    invalid = fail_directly(settings, client, "pur", [({"n": i}, "invalid_request", "no") for i in range(3)])
    failed = fail_directly(settings, client, "pur", [({"n": i}, "failure", "boom") for i in range(2)])
    other = fail_directly(settings, client, "other", [({"n": 9}, "invalid_request", "no")])
    ck = CapabilityKeys(prefix, "pur")

    dry = dlq_json(settings, "purge", "--reason", "invalid_request", "--dry-run")
    assert dry["counts"] == {"would_purge": 4} and r.xlen(ck.dlq) == 5
    refused = dlq(settings, "purge", "--reason", "invalid_request")  # bulk needs --yes off a terminal
    assert refused.exit_code == 2 and "--yes" in one_line_error(refused) and r.xlen(ck.dlq) == 5

    done = dlq_json(settings, "purge", "--reason", "invalid_request", "-c", "pur", "--yes")
    assert done["counts"] == {"purged": 3}
    assert sorted(dlq_task_ids(settings, "pur")) == sorted(h.task_id for h in failed)
    assert dlq_task_ids(settings, "other") == [other[0].task_id]

    one = dlq_json(settings, "purge", failed[0].task_id)
    assert one["counts"] == {"purged": 1}
    assert dlq_json(settings, "purge", "--older-than", "1h", "--yes")["counts"] == {}
    assert dlq_json(settings, "purge", "--since", "1h", "--agent", "agent-t", "--yes")["counts"] == \
        {"purged": 2}
    assert r.xlen(ck.dlq) == 0 and r.xlen(CapabilityKeys(prefix, "other").dlq) == 0
    gone = dlq(settings, "purge", failed[0].task_id)
    assert gone.exit_code == 1 and "no dead letter" in one_line_error(gone)
    assert all(h.status().state == "failed" for h in invalid)  # the records themselves stay


def test_export_import_round_trip(client: ReachClient,
                                  r: redis.Redis, prefix: str, tmp_path: Path) -> None:
    source = client.settings
    handles = fail_directly(source, client, "mv", [({"n": 1, "text": "é ✓"}, "failure", "boom"),
                                                   ({"n": 2}, "retryable_failure", "rate limit"),
                                                   ({"n": 3}, "bad_result", "NaN")])
    dead_letter_raw(source, r, "mv", {"garbage": "yes"})
    out = tmp_path / "dlq.jsonl"
    exported = dlq_json(source, "export", "--out", str(out))
    assert exported == {"exported": 4, "file": str(out)}
    assert len(out.read_text().splitlines()) == 4
    assert r.xlen(CapabilityKeys(prefix, "mv").dlq) == 4  # export changes nothing

    target = source.model_copy(update={"prefix": f"{prefix}:b"})  # another environment
    assert dlq_json(target, "import", str(out), "--dry-run")["imported"] == 4
    assert dlq_json(target, "list") == []
    assert dlq_json(target, "import", str(out)) == {
        "read": 4, "imported": 4, "duplicates": 0, "by_capability": {"mv": 4}, "dry_run": False}
    assert dlq_json(target, "import", str(out))["duplicates"] == 4  # twice adds nothing

    def comparable(items: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        return sorted((i["task_id"] or "", i["reason"], i["error"], i["attempts"], i["dead_at"],
                       i["last_agent_id"] or "") for i in items)

    assert comparable(dlq_json(target, "list")) == comparable(dlq_json(source, "list"))
    moved = dlq_json(target, "show", handles[1].task_id)
    original = dlq_json(source, "show", handles[1].task_id)
    for key in ("payload", "attempt_history", "events", "envelope", "trace_id"):
        assert moved[key] == original[key], key
    assert moved["imported_from"].startswith("mv/")

    # The task has no record in the target: replay rebuilds it from the dead letter.
    ck = CapabilityKeys(target.prefix, "mv")
    local = handles[0].task_id.split(":")[1]
    assert not r.exists(ck.task(local))
    with DeadLetters(target) as d:
        assert d.replay(d.select([handles[0].task_id])).counts() == {"replayed": 1}
    record = r.hgetall(ck.task(local))
    assert record["state"] == "queued" and record["payload"] == json.dumps({"n": 1, "text": "é ✓"},
                                                                             ensure_ascii=False,
                                                                             separators=(",", ":"))
    assert record["fence"] == r.hget(CapabilityKeys(prefix, "mv").task(local), "fence")
    types = [e.type for e in read_events(r, ck.task(local), handles[0].task_id)]
    assert types[-4:] == ["failed", "dead_lettered", "replayed", "queued"]
    assert r.zrange(ck.queue, 0, -1) == [local] and r.ttl(ck.task(local)) == -1
    assert "mv" in r.smembers(RegistryKeys(target.prefix).capabilities)


def test_bad_arguments_get_one_line_and_exit_2(settings: Settings, client: ReachClient,
                                               tmp_path: Path) -> None:
    handle = fail_directly(settings, client, "bad", [({"n": 1}, "failure", "boom")])[0]
    bad_file = tmp_path / "bad.jsonl"
    bad_file.write_text('{"v": 1, "capability": "bad", "entry_id": "1-0", "fields": {}}\n')
    bad_record = tmp_path / "bad_record.jsonl"
    bad_record.write_text(json.dumps({"v": 1, "capability": "bad", "entry_id": "1-0", "fields": {
        "task_id": "", "reason": "malformed", "dead_at": "1", "record": "[1]"}}) + "\n")
    cases = [
        (["show", "nope"], "invalid dead-letter id"),
        (["show", "bad/12"], "invalid dead-letter id"),
        (["list", "--since", "soon"], "invalid time"),
        (["list", "--reason", "nope"], "invalid reason"),
        (["list", "-c", "Bad"], "invalid capability name"),
        (["list", "--limit", "0"], "limit must be from 1 to 10000"),
        (["list", "--before", handle.task_id], "invalid --before"),
        (["purge", "--older-than", "3x", "--yes"], "invalid time"),
        (["purge", "--since", "1h", "--older-than", "2h", "--yes"], "conflicting filters"),
        (["replay", handle.task_id, "--all"], "conflicting selection"),
        (["replay", handle.task_id, "--reason", "failure"], "conflicting selection"),
        (["replay", "--all", "--reason", "failure", "--yes"], "conflicting selection"),
        (["replay"], "nothing selected"),
        (["purge"], "nothing selected"),
        (["replay", "--all", "--priority", "12", "--yes"], "priority must be an int from 0 to 9"),
        (["replay", "--all", "--rate", "0", "--yes"], "rate must be more than 0"),
        (["replay", "--all"], "needs --yes"),
        (["import", str(tmp_path / "missing.jsonl")], "cannot read"),
        (["import", str(bad_file)], "bad.jsonl:1: missing field(s) task_id, reason, dead_at"),
        (["import", str(bad_record)], "bad_record.jsonl:1: record must be a JSON object"),
    ]
    for args, message in cases:
        done = dlq(settings, *args)
        assert done.exit_code == 2, (args, done.stdout, done.stderr)
        assert message in one_line_error(done), (args, done.stderr)
    unknown = dlq(settings, "show", "bad:01KZZZZZZZZZZZZZZZZZZZZZZZ")
    assert unknown.exit_code == 1 and "no dead letter" in one_line_error(unknown)
    unknown = dlq(settings, "replay", "bad:01KZZZZZZZZZZZZZZZZZZZZZZZ", handle.task_id)
    assert unknown.exit_code == 1 and "no dead letter" in one_line_error(unknown)
    assert handle.status().state == "failed", "nothing replayed when one id is unknown"
    assert dlq(settings, "--no-such-flag").exit_code == 2


# -- retention and scale -------------------------------------------------------------------------

def _fake_entry(task_id: str, reason: str, dead_at: int, error: str = "boom") -> dict[str, str]:
    record = {"id": task_id, "cap": task_id.split(":")[0], "payload": json.dumps({"text": "x" * 200}),
              "state": "failed", "attempt": "1", "fence": "1"}
    return {"task_id": task_id, "reason": reason, "error": error, "attempts": "1",
            "last_agent_id": "agent-x", "dead_at": str(dead_at), "record": json.dumps(record),
            "history": "[]"}


def test_retention_trims_by_age_and_never_drops_a_younger_entry(
    make_settings: Callable[..., Settings], r: redis.Redis, prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = make_settings(dlq_retention_ms=3_600_000, dlq_maxlen=2)
    ck = CapabilityKeys(prefix, "ret")
    now = server_now(r)
    ages_min = [300, 200, 61, 59, 30, 0]  # minutes
    for i, age in enumerate(ages_min):
        ms = now - age * 60_000
        r.xadd(ck.dlq, _fake_entry(f"ret:{'0' * 25}{i}", "failure", ms), id=f"{ms}-0")
    r.sadd(RegistryKeys(prefix).capabilities, "ret")
    with caplog.at_level(logging.WARNING, logger="reach.dlq"):
        assert dlq_tools.trim(r, settings, "ret") == 3
    left = [e[0] for e in r.xrange(ck.dlq)]
    assert [int(e.split("-")[0]) for e in left] == [now - a * 60_000 for a in (59, 30, 0)]
    assert "over dlq_maxlen 2" in caplog.text  # over the cap, but nothing young is dropped
    assert dlq_tools.trim(r, settings, "ret") == 0
    assert dlq_json(settings, "trim") == {"removed": {"ret": 0}, "total": 0}


def test_a_large_dlq_is_listed_paged_and_counted_fast(settings: Settings, r: redis.Redis,
                                                      prefix: str) -> None:
    import time

    n = 10_000
    ck = CapabilityKeys(prefix, "big")
    now = server_now(r) - n
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        reason = "expired" if i == 7 else ("failure" if i % 2 else "invalid_request")
        pipe.xadd(ck.dlq, _fake_entry(f"big:{i:026d}".replace("I", "1"), reason, now + i,
                                      error=f"error kind {i % 3}"), id=f"{now + i}-0")
        if i % 2000 == 1999:
            pipe.execute()
    pipe.execute()
    r.sadd(RegistryKeys(prefix).capabilities, "big")
    with DeadLetters(settings) as d:
        started = time.monotonic()
        page = d.list(limit=50)
        rare = d.list(Filter(reason="expired"), limit=10)  # the one match is near the far end
        stats = d.stats()
        found = d.get(f"big:{7:026d}")
        elapsed = time.monotonic() - started
        assert [int(x.entry_id.split("-")[0]) for x in page.items] == [now + n - 1 - i for i in range(50)]
        assert [x.task_id for x in rare.items] == [f"big:{7:026d}"] and rare.next_before is None
        assert stats.total == n and stats.by_reason["expired"] == 1
        assert {e.error for e in stats.top_errors} == {"error kind 0", "error kind 1", "error kind 2"}
        assert found.letter.reason == "expired"
        # A guard against loading everything or scanning per row, not a benchmark (the machine
        # may be busy): on an idle one this takes well under a second.
        assert elapsed < 10, f"list + filtered list + stats + get took {elapsed:.1f}s"
        walked, before = 0, None
        while True:
            chunk = d.list(limit=3000, before=before)
            walked += len(chunk.items)
            if not chunk.next_before:
                break
            before = chunk.next_before
        assert walked == n
