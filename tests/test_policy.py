"""The fleet's policy and the operators' controls, end to end with real dispatcher and worker
processes: settings on the services apply to every producer's tasks; pause, rate limits,
max_running, delayed tasks, periodic schedules, bulk cancel and the no-agent timeout."""

from __future__ import annotations

import itertools
import json
import logging
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis

from broker import ReachClient, SubmitOptions, TaskFailed
from broker.ids import split_task_id
from broker.keys import CapabilityKeys
from broker.registry import clock_of
from broker.schedule import Schedule
from broker.settings import Settings
from tests.conftest import ROOT, Fleet, settings_env, wait_until
from tests.handlers import run_order, runs

pytestmark = pytest.mark.one_redis


def reach(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "reach_cli", *args], env=settings_env(settings),
                          cwd=ROOT, capture_output=True, text=True, timeout=60)


def server_ms(r: redis.Redis, capability: str, prefix: str) -> int:
    return clock_of(r, CapabilityKeys(prefix, capability).queue)


def started_at(r: redis.Redis, prefix: str, task_id: str) -> int:
    capability, local = split_task_id(task_id)
    return int(r.hget(CapabilityKeys(prefix, capability).task(local), "started_at") or 0)


def test_the_services_settings_are_the_policy_of_every_producers_tasks(
    client: ReachClient, settings: Settings, fleet: Fleet, r: redis.Redis, prefix: str
) -> None:
    # Only the dispatcher has them: the producer (and the worker) run with the defaults.
    fleet.dispatcher(env={"REACH_MAX_ATTEMPTS": "2", "REACH_AGING_MS": "250"})
    wait_until(lambda: client.policy("order")["aging_ms"] == 250, message="the policy seeded")
    assert client.policy(None).sources["max_attempts"].describe().startswith("config of dispatcher-")
    fleet.worker("flaky", handler="tests.handlers:always_retryable", concurrency=2)
    with pytest.raises(TaskFailed) as failed:
        client.run("flaky", {"n": 0}, timeout=30)
    assert failed.value.reason == "retries_exhausted" and runs(r, prefix) == {"0": 2}
    # Aging: a priority-0 task that waited 2 s (8 levels of 250 ms) goes before priority-5
    # tasks queued after it.
    early = client.submit("order", {"n": 0}, priority=0)
    created = int(r.hget(CapabilityKeys(prefix, "order").task(split_task_id(early.task_id)[1]),
                         "created_at"))
    wait_until(lambda: server_ms(r, "order", prefix) - created >= 2000, message="2 s of waiting")
    late = client.submit_many("order", [{"n": i} for i in range(1, 6)], priority=5)
    fleet.worker("order", handler="tests.handlers:record_order", concurrency=1)
    for handle in [early, *late]:
        handle.result(timeout=30)
    assert run_order(r, prefix)[0] == "0"


def test_pause_holds_every_start_and_resume_lets_them_go(
    client: ReachClient, settings: Settings, fleet: Fleet, r: redis.Redis, prefix: str
) -> None:
    cap = "held"
    fleet.dispatcher()
    fleet.worker(cap, handler="tests.handlers:record", concurrency=4)
    assert client.run(cap, {"n": 0}, timeout=30) == {"n": 0}  # (grants stand now)
    done = reach(settings, "pause", cap, "--reason", "upstream outage")
    assert done.returncode == 0, done.stderr
    wait_until(lambda: "paused" in (fleet.procs[0].output()), message="the dispatcher to see it")
    handles = [client.submit(cap, {"n": i}) for i in range(1, 4)]  # (by grant: held)
    handles += client.submit_many(cap, [{"n": i} for i in range(4, 20)])  # (by rounds, pulls)
    window = time.monotonic() + 1.5
    while time.monotonic() < window:  # (a bounded window: nothing may start in it)
        assert all(h.status().state == "queued" for h in handles)
        time.sleep(0.1)
    queues = json.loads(reach(settings, "queues", "--json").stdout)
    row = next(q for q in queues if q["capability"] == cap)
    assert row["paused"] and row["paused_reason"] == "upstream outage" and row["queued"] == 19
    assert reach(settings, "resume", cap).returncode == 0
    assert [h.result(timeout=30) for h in handles] == [{"n": i} for i in range(1, 20)]


def test_a_rate_of_5_per_second_starts_50_in_10_seconds_with_two_dispatchers(
    client: ReachClient, settings: Settings, fleet: Fleet, r: redis.Redis, prefix: str
) -> None:
    cap = "rated"
    client.set_policy(cap, rate=5.0)
    for _ in range(2):
        fleet.dispatcher()
    fleet.workers(2, cap, handler="tests.handlers:record", concurrency=8)
    handles: list[Any] = []
    window_over = threading.Event()

    def produce() -> None:  # (a steady trickle: grants are in play while the queue is empty)
        with ReachClient(settings) as producer:
            for i in range(150):  # (12.5 a second, well above the rate, until the window ends)
                if window_over.is_set():
                    break
                handles.append(producer.submit(cap, {"n": i}))
                time.sleep(0.08)

    thread = threading.Thread(target=produce)
    thread.start()
    wait_until(lambda: len(handles) > 0 and started_at(r, prefix, handles[0].task_id),
               message="the first start")
    first = started_at(r, prefix, handles[0].task_id)
    wait_until(lambda: server_ms(r, cap, prefix) >= first + 10_500, timeout=30, message="10 s")
    window_over.set()
    thread.join()
    starts = [started_at(r, prefix, h.task_id) for h in list(handles)]
    in_window = sum(1 for s in starts if first <= s < first + 10_000)
    client.cancel_many(cap)
    assert 40 <= in_window <= 60, f"{in_window} starts in 10 s at 5/s"
    assert int(r.hget(CapabilityKeys(prefix, cap).stats, "direct") or 0) > 0, "no grant was used"


def test_max_running_2_never_lets_a_third_task_run(
    client: ReachClient, settings: Settings, fleet: Fleet, r: redis.Redis, prefix: str
) -> None:
    cap = "capped"
    client.set_policy(cap, max_running=2)
    fleet.dispatcher()
    fleet.workers(2, cap, handler="tests.handlers:concurrency_probe", concurrency=4,
                  env={"REACH_TEST_AGENT": "fleet"})
    handles = client.submit_many(cap, [{"n": i, "s": 0.15} for i in range(12)])
    assert [h.result(timeout=60)["n"] for h in handles] == list(range(12))
    assert r.hget(f"{prefix}:test:max", "fleet") == "2"


def test_a_delayed_task_starts_no_earlier_than_its_time(
    client: ReachClient, settings: Settings, fleet: Fleet, r: redis.Redis, prefix: str
) -> None:
    fleet.dispatcher()
    fleet.worker("soon", handler="tests.handlers:record", concurrency=2)
    handle = client.submit("soon", {"n": 0}, SubmitOptions(delay_s=1.5))
    at = datetime.now(UTC) + timedelta(seconds=1)
    timed = client.submit("soon", {"n": 1}, at=at)
    assert handle.status().state == "scheduled" and timed.status().state == "scheduled"
    assert handle.result(timeout=30) == {"n": 0} and timed.result(timeout=30) == {"n": 1}
    record = r.hgetall(CapabilityKeys(prefix, "soon").task(split_task_id(handle.task_id)[1]))
    assert int(record["started_at"]) >= int(record["created_at"]) + 1500
    assert int(r.hget(CapabilityKeys(prefix, "soon").task(split_task_id(timed.task_id)[1]),
                      "started_at")) >= round(at.timestamp() * 1000) - 50  # (clocks of one host)
    assert [e.type for e in handle.events(timeout=5)][:2] == ["scheduled", "queued"]


def test_an_every_second_schedule_makes_one_task_per_second_with_two_dispatchers(
    client: ReachClient, settings: Settings, fleet: Fleet, r: redis.Redis, prefix: str
) -> None:
    cap = "tick"
    fleet.worker(cap, handler="tests.handlers:record_due", concurrency=4)
    client.add_schedule(Schedule("ticker", cap, {"n": "tick"}, every_ms=1000))
    for _ in range(2):
        fleet.dispatcher()
    key = f"{prefix}:test:dues"
    wait_until(lambda: r.llen(key) >= 6, timeout=30, message="six due times")
    dues = sorted(int(d) for d in r.lrange(key, 0, -1))
    assert len(dues) == len(set(dues)), f"a due time made two tasks: {dues}"
    assert all(b - a == 1000 for a, b in itertools.pairwise(dues)), dues
    assert reach(settings, "schedule", "pause", "ticker").returncode == 0
    paused_at = r.llen(key)
    listed = json.loads(reach(settings, "schedule", "list", "--json").stdout)
    assert listed[0]["name"] == "ticker" and listed[0]["paused"]
    wait_until(lambda: server_ms(r, cap, prefix) >= dues[-1] + 2500, message="2.5 s paused")
    assert r.llen(key) <= paused_at + 1  # (one in flight at the pause, at most)


def test_bulk_cancel_dry_run_changes_nothing_then_cancels(
    client: ReachClient, settings: Settings, r: redis.Redis, prefix: str
) -> None:
    cap = "bulk"
    handles = client.submit_many(cap, [{"n": i} for i in range(20)])
    later = client.submit(cap, {"n": 20}, delay_s=600)
    dry = reach(settings, "cancel", "--capability", cap, "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["matched"] == 21
    assert all(h.status().state == "queued" for h in handles) and later.status().state == "scheduled"
    done = reach(settings, "cancel", "--capability", cap, "--state", "queued", "--yes", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["canceled"] == 20
    assert all(h.status().state == "canceled" for h in handles) and later.status().state == "scheduled"
    assert reach(settings, "cancel", "--capability", cap, "--state", "nope").returncode == 2


def test_a_task_no_agent_serves_fails_as_no_agent_timeout_and_the_producer_is_warned(
    client: ReachClient, settings: Settings, fleet: Fleet, r: redis.Redis, prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fleet.worker("summarize", handler="tests.handlers:record", concurrency=1)
    fleet.dispatcher(env={"REACH_NO_AGENT_TIMEOUT_MS": "1000"})
    wait_until(lambda: client.policy(None)["no_agent_timeout_ms"] == 1000, message="seeded")
    with caplog.at_level(logging.WARNING, logger="reach.client"):
        handle = client.submit("sumarize", {"n": 0})
    assert "did you mean 'summarize'?" in caplog.text
    with pytest.raises(TaskFailed) as failed:
        handle.result(timeout=30)
    assert failed.value.reason == "no_agent_timeout"
    assert r.xlen(CapabilityKeys(prefix, "sumarize").dlq) == 1
    submitted = reach(settings, "submit", "sumarize", "{}")
    assert submitted.returncode == 0 and "did you mean 'summarize'?" in submitted.stderr


@pytest.mark.parametrize("args", [
    ["policy", "set", "Bad Name", "--max-attempts", "2"],
    ["policy", "set", "cap", "--rate", "-1/s"],
    ["policy", "set", "cap", "--rate", "0"],
    ["policy", "set", "cap", "--rate", "fast"],
    ["policy", "set", "cap", "--max-attempts", "0"],
    ["policy", "set", "cap", "--timeout", "5x"],
    ["policy", "set", "cap", "--max-running", "0"],
    ["policy", "set", "cap"],
    ["policy", "set", "cap", "--global", "--max-attempts", "2"],
    ["schedule", "add", "n", "--capability", "cap", "--payload", "{}", "--cron", "bad"],
    ["schedule", "add", "n", "-c", "cap", "--payload", "{}", "--every", "1s", "--cron", "* * * * *"],
    ["schedule", "add", "n", "-c", "cap", "--payload", "{}", "--every", "10ms"],
    ["schedule", "add", "n", "-c", "cap", "--payload", "{}", "--cron", "* * * * *", "--timezone", "Mars/X"],
    ["submit", "cap", "{}", "--at", "2020-01-01T00:00:00Z"],
    ["submit", "cap", "{}", "--at", "2030-01-01T00:00:00"],
    ["submit", "cap", "{}", "--delay", "soon"],
])
def test_bad_flags_exit_2_with_one_line_and_change_nothing(
    settings: Settings, client: ReachClient, args: list[str]
) -> None:
    done = reach(settings, *args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and done.stderr.startswith("error: "), done.stderr
    assert client.policy_history("cap") == [] and client.schedules() == []
    assert client.queue_depth("cap") == 0
