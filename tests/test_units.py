"""Pure logic, tested without Redis: ids, codec, settings, routing, classification, backoff."""

from __future__ import annotations

import asyncio
import logging
import random
from pathlib import Path

import pytest

import agent_worker
import broker
import dispatcher
from agent_worker import InvalidRequest, Retryable
from agent_worker.builtin.summarize import split_sentences, summarize
from agent_worker.classify import backoff_ms, classify, describe
from agent_worker.http_bridge.outcome import AgentFailed, interpret
from broker import Settings, codec
from broker.client.events import events_of_record, feed_events, message_is_terminal
from broker.ids import new_task_id, split_task_id
from broker.models import Outcome, TaskEvent
from broker.protocol.delivery import parse_entry as parse_delivery
from broker.protocol.lifecycle import parse_done as done_outcome
from broker.registry import AgentRecord, AgentState, agent_state
from broker.settings import redact_url
from dispatcher.routing import Candidate, InboxLoad, ReadyTask, assign, refill_allowance, room


def test_public_exports_match_all() -> None:
    for module in (broker, agent_worker, dispatcher):
        assert sorted(module.__all__) == sorted(set(module.__all__))
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__}.{name}"
    for name in ("ReachClient", "AsyncReachClient", "TaskFailed", "QueueFull", "TaskCanceled",
                 "BrokerUnavailable", "UnknownTask"):
        assert name in broker.__all__
    for name in ("TaskContext", "InvalidRequest", "Retryable"):
        assert name in agent_worker.__all__


def test_task_ids_carry_their_capability_and_sort_by_time() -> None:
    a = new_task_id("summarize")
    cap, local = split_task_id(a)
    assert cap == "summarize" and len(local) == 26
    ids = [new_task_id("x") for _ in range(5000)]  # many within one millisecond
    assert ids == sorted(ids) and len(set(ids)) == 5000, "strictly increasing: FIFO among ties"


def test_codec_round_trip_and_refusals() -> None:
    value = {"a": [1, 2.5, "ü", None, True], "b": {"c": "d"}}
    assert codec.loads(codec.encode_payload(value, 10_000)) == value
    with pytest.raises(ValueError):
        codec.loads("NaN")
    with pytest.raises(broker.InvalidPayload, match=r"payload\['a'\]\[0\]"):
        codec.encode_payload({"a": [float("nan")]}, 100)


def test_settings_precedence_flag_env_file_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    assert Settings.load().lease_ms == 30000  # built-in default
    (tmp_path / "reach.toml").write_text("lease_ms = 1000\naging_ms = 7\n[capabilities.summarize]\n"
                                          "timeout_ms = 5000\n")
    s = Settings.load()
    assert (s.lease_ms, s.aging_ms, s.timeout_ms_for("summarize")) == (1000, 7, 5000)
    monkeypatch.setenv("REACH_LEASE_MS", "2000")
    assert Settings.load().lease_ms == 2000  # environment beats the file
    assert Settings.load(lease_ms=3000).lease_ms == 3000  # a flag beats the environment
    assert Settings.load(lease_ms=None).lease_ms == 2000  # an unset flag changes nothing
    other = tmp_path / "other.toml"
    other.write_text("[reach]\nprefix = 'other'\n")
    monkeypatch.setenv("REACH_CONFIG", str(other))
    assert Settings.load().prefix == "other"  # REACH_CONFIG beats ./reach.toml
    monkeypatch.setenv("REDIS_URL", "redis://h:1/3")
    assert Settings.load().redis_url == "redis://h:1/3" and Settings.load().redis_url_given


def test_settings_defaults_are_the_designs() -> None:
    s = Settings.load(redis_url="redis://x")
    assert (s.prefix, s.heartbeat_ms, s.suspect_after_ms, s.offline_after_ms, s.lease_ms) == (
        "reach", 5000, 15000, 30000, 30000)
    assert (s.aging_ms, s.max_attempts, s.backoff_base_ms, s.backoff_max_ms, s.backoff_jitter_ms) == (
        30000, 3, 500, 8000, 500)
    assert (s.watermark, s.backlog_factor, s.max_queue_depth, s.max_payload_bytes) == (
        0.85, 5, 100000, 1048576)
    assert (s.result_ttl_ms, s.idempotency_ttl_ms, s.default_timeout_ms) == (86400000, 86400000, 300000)
    assert (s.circuit_failures, s.circuit_open_ms, s.cold_start_ms) == (10, 10000, 120000)


def test_redacted_url_hides_the_password() -> None:
    s = Settings.load(redis_url="rediss://app:hunter2@redis.example:6380/1")
    assert s.redacted_url() == "rediss://app:***@redis.example:6380/1"
    # A password holding '@', one in the query (redis-py honours ?password=), Sentinel hosts.
    assert redact_url("rediss://u:p@ss@h:6380/1") == "rediss://u:***@h:6380/1"
    assert redact_url("redis://h:1/0?socket_timeout=5&password=s3cret") == \
        "redis://h:1/0?socket_timeout=5&password=***"
    assert redact_url("unix:///tmp/r.sock?db=1&Password=x") == "unix:///tmp/r.sock?db=1&Password=***"
    assert redact_url("redis+sentinel://:pw@a:26379,b:26379/main") == \
        "redis+sentinel://:***@a:26379,b:26379/main"


@pytest.mark.parametrize("exc, outcome", [
    (InvalidRequest("x"), Outcome.INVALID_REQUEST),
    (Retryable("x"), Outcome.RETRYABLE_FAILURE),
    (TimeoutError(), Outcome.RETRYABLE_FAILURE),
    (ConnectionError(), Outcome.RETRYABLE_FAILURE),
    (RuntimeError("x"), Outcome.FAILURE),
    (__import__("redis").exceptions.ConnectionError("x"), Outcome.RETRYABLE_FAILURE),
    (__import__("redis").exceptions.TimeoutError("x"), Outcome.RETRYABLE_FAILURE),
    (KeyError("x"), Outcome.FAILURE),
])
def test_classification(exc: BaseException, outcome: Outcome) -> None:
    assert classify(exc) is outcome


def test_classification_of_payload_validation_errors() -> None:
    from pydantic import BaseModel, ValidationError

    class P(BaseModel):
        text: str

    with pytest.raises(ValidationError) as err:
        P.model_validate({})
    assert classify(err.value) is Outcome.INVALID_REQUEST
    assert describe(err.value) == "text: Field required"
    assert classify(RuntimeError(), retry_failures=True) is Outcome.RETRYABLE_FAILURE


def test_backoff_doubles_is_capped_and_jittered() -> None:
    s = Settings.load(redis_url="redis://x")
    rng = random.Random(7)
    for attempt, base in [(1, 500), (2, 1000), (3, 2000), (4, 4000), (5, 8000), (9, 8000)]:
        for _ in range(20):
            delay = backoff_ms(attempt, s, rng)
            assert base <= delay <= base + 500
        assert base <= backoff_ms(attempt, s) <= base + 500  # tenacity's own jitter


def _record(**kw: object) -> AgentRecord:
    from broker.models import AgentDescriptor

    return AgentRecord(agent_id="a", descriptor=AgentDescriptor(agent_id="a", capabilities=["c"]),
                       last_seen_ms=int(kw.get("last_seen", 100_000)), registered_at_ms=0,
                       warm_until_ms=int(kw.get("warm_until", 0)), mode=str(kw.get("mode", "active")),
                       stats=dict(kw.get("stats", {})))  # type: ignore[call-overload]


def test_agent_states_by_server_clock() -> None:
    s = Settings.load(redis_url="redis://x")
    now = 100_000
    assert agent_state(_record(), now, s) is AgentState.HEALTHY
    assert agent_state(_record(last_seen=now - 15_000), now, s) is AgentState.SUSPECT
    assert agent_state(_record(last_seen=now - 30_000), now, s) is AgentState.OFFLINE
    assert agent_state(_record(mode="draining"), now, s) is AgentState.DRAINING
    assert agent_state(_record(warm_until=now + 1), now, s) is AgentState.WARMING
    stalled = {"loop_progress_age_ms": 25_000, "inflight": 1}
    assert agent_state(_record(stats=stalled), now, s) is AgentState.NOT_READY
    idle_stall = {"loop_progress_age_ms": 25_000, "inflight": 0}
    assert agent_state(_record(stats=idle_stall), now, s) is AgentState.HEALTHY


def test_room_respects_watermark_backlog_and_speed() -> None:
    s = Settings.load(redis_url="redis://x")
    def cand(running: int, outstanding: int, p50: float | None = None, conc: int = 8) -> Candidate:
        return Candidate("a", conc, InboxLoad(outstanding, running), p50)

    assert room(cand(7, 7), s) == 0  # 7/8 >= 0.85: at the watermark
    assert room(cand(6, 6), s) == 3  # two free slots + prefetch 1 (unknown speed)
    assert room(cand(0, 0, p50=0.01), s) == 40  # a fast agent gets a deep buffer, capped at 5x
    assert room(cand(0, 40, p50=0.01), s) == 0  # backlog limit reached
    # An agent that finishes less than a task per refill: its free slots, no prefetch (a task
    # in its inbox would wait for its next free slot; in the queue, for the fleet's).
    assert room(cand(0, 0, p50=10_000), s) == 8
    assert room(cand(5, 5, p50=40.0), s) == 3
    assert room(cand(0, 0, p50=1.0), s) == 8 + 16  # 8 x 2 ms refill / 1 ms a task


def test_a_fast_agent_at_the_watermark_still_gets_its_refill_allowance() -> None:
    s = Settings.load(redis_url="redis://x")

    def cand(running: int, outstanding: int, p50: float | None = None,
             recent: float | None = None) -> Candidate:
        return Candidate("a", 8, InboxLoad(outstanding, running), p50, recent_exec_ms=recent)

    # 8 x 2 ms refill window / 0.2 ms per task = 80 tasks, capped at the 5 x 8 backlog limit.
    assert refill_allowance(cand(8, 8, p50=0.2), s) == 40
    assert room(cand(8, 8, p50=0.2), s) == 40
    assert room(cand(8, 29, p50=0.2), s) == 0  # 21 unread: more than half the buffer, wait
    assert room(cand(8, 28, p50=0.2), s) == 20  # half used: top it up
    assert refill_allowance(cand(8, 8, p50=2.0), s) == 8
    # The dispatcher's own view of recent completions beats a stale heartbeat p50.
    assert room(cand(8, 8, p50=0.2, recent=400.0), s) == 0
    assert room(cand(8, 8, p50=400.0, recent=0.2), s) == 40
    # A slow agent, or one of unknown speed, at the watermark gets nothing: no task waits
    # behind a long one while another agent could take it.
    assert room(cand(8, 8, p50=1000.0), s) == 0
    assert room(cand(7, 7), s) == 0


def test_assign_skips_full_agents_and_stops_when_everyone_is_full() -> None:
    s = Settings.load(redis_url="redis://x")
    full = Candidate("full", 4, InboxLoad(4, 4))  # 4/4 running: over the watermark
    busy = Candidate("busy", 4, InboxLoad(2, 2))  # room 4 - 2 + 1 = 3
    idle = Candidate("idle", 4, InboxLoad(0, 0))  # room 4 - 0 + 1 = 5
    tasks = [ReadyTask(str(i)) for i in range(20)]
    plan = assign(tasks, [full, busy, idle], s, random.Random(1))
    assert "full" not in plan
    assert len(plan["idle"]) == 5 and len(plan["busy"]) == 3  # everything that fits, no more


def test_summarizer_picks_central_sentences_in_order() -> None:
    text = ("Cats sleep a lot. Cats hunt mice at night. The weather was cold. Cats and mice are old "
            "enemies. Tea is nice.")
    chosen = summarize(text, 2)
    assert len(chosen) == 2 and all("Cats" in s for s in chosen)
    assert chosen == sorted(chosen, key=text.index)
    assert split_sentences("One. Two!  Three?") == ["One.", "Two!", "Three?"]


@pytest.mark.parametrize("status, body, expect", [
    (200, b'{"status": "success", "result": {"x": 1}}', {"x": 1}),
    (200, b'{"y": 2}', {"y": 2}),
    (200, b'{"status": "invalid_request", "error": "no text"}', InvalidRequest),
    (200, b'{"status": "retryable_failure", "error": "slow"}', Retryable),
    (200, b'{"status": "failure", "error": "no"}', AgentFailed),
    (429, b"busy", Retryable),
    (503, b"", Retryable),
    (400, b"bad", InvalidRequest),
    (500, b"oops", Retryable),
    (501, b"oops", AgentFailed),
    (200, b"not json", AgentFailed),
])
def test_http_bridge_interprets_business_status(status: int, body: bytes, expect: object) -> None:
    if isinstance(expect, type) and issubclass(expect, BaseException):
        with pytest.raises(expect):
            interpret(status, body)
    else:
        assert interpret(status, body) == expect


def test_compact_events_read_back_as_task_events() -> None:
    # The layout the scripts write (broker/lua/_events.lua): type|time ms|attempt|agent|data JSON.
    event = TaskEvent.from_compact(3, 'progress|1764000000123|2|w-1|{"m":"a|b"}', "cap:ID", "tr")
    assert (event.seq, event.type, event.attempt, event.agent_id, event.data) == (
        3, "progress", 2, "w-1", {"m": "a|b"})
    assert event.as_dict()["time"] == 1764000000123 and event.trace_id == "tr"
    assert TaskEvent.from_compact(1, "queued|1|0||{}", "cap:ID", None).agent_id is None
    with pytest.raises(ValueError):
        TaskEvent.from_compact(1, "not an event", "cap:ID", None)
    record = {"id": "cap:ID", "trace": "t", "seq": "2", "e:2": "succeeded|5|1|w|{}",
              "e:1": "queued|4|0||{}", "e:x": "junk", "state": "succeeded"}
    assert [e.type for e in events_of_record(record, "cap:ID")] == ["queued", "succeeded"]
    assert message_is_terminal('7|succeeded|5|1|w|{}') and not message_is_terminal('2|dispatched|5|0|w|{}')
    feed = feed_events({"events": 'cap:A|1|queued|4|0||{"priority":5}\n|0|token_refused|9|0|w|{"call":"x"}'})
    assert [(e["task_id"], e["type"], e["agent_id"]) for e in feed] == [
        ("cap:A", "queued", None), ("", "token_refused", "w")]


def test_a_done_list_entry_gives_the_outcome_or_asks_for_the_record() -> None:
    assert done_outcome("c:1", '{"state":"succeeded","result":{"x":[1]}}') == (True, {"x": [1]})
    assert done_outcome("c:1", '{"state":"succeeded"}') == (False, None)  # too large to ride along
    with pytest.raises(broker.TaskFailed) as failed:
        done_outcome("c:1", '{"state":"failed","reason":"expired","error":"late"}')
    assert (failed.value.reason, failed.value.error) == ("expired", "late")
    with pytest.raises(broker.TaskCanceled):
        done_outcome("c:1", '{"state":"canceled","reason":"canceled","error":null}')
    assert done_outcome("c:1", "garbage") == (False, None)


def test_an_inbox_entry_carries_what_starting_its_task_needs() -> None:
    fields = {"id": "01J00000000000000000000000", "fence": "4", "p": '{"a":1}',
              "x": '2|60000|0|3|trace|conv|{"k":"v|w"}'}
    task = parse_delivery("cap", "1-0", fields)
    assert task is not None
    assert (task.task_id, task.attempt, task.timeout_ms, task.max_attempts, task.session_id,
            task.metadata) == ("cap:01J00000000000000000000000", 2, 60000, 3, "conv", '{"k":"v|w"}')
    assert parse_delivery("cap", "1-0", {"id": fields["id"], "fence": "4"}) is None  # accept first
    assert parse_delivery("cap", "1-0", {**fields, "x": "2|bad"}) is None
    assert parse_delivery("cap", "1-0", {**fields, "fence": "x"}) is None
    # Forged or corrupt entries are no delivery (and crash nothing): a newline after the id,
    # digits that are not ASCII, a deadline past what a datetime holds, a negative timeout.
    assert parse_delivery("cap", "1-0", {**fields, "id": fields["id"] + "\n"}) is None
    assert parse_delivery("cap", "1-0", {**fields, "fence": "\u00b2"}) is None
    assert parse_delivery("cap", "1-0", {**fields, "x": "2|60000|99999999999999999|3|||"}) is None
    assert parse_delivery("cap", "1-0", {**fields, "x": "2|-1|0|3|||"}) is None


async def test_a_supervised_job_backs_off_while_it_fails_and_starts_over_once_it_ran_well(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from agent_worker.worker import supervised

    # fails at once twice, then runs well for a while and fails, then ends
    plan = iter([0.0, 0.0, 0.3, None])
    calls = 0

    async def job() -> None:
        nonlocal calls
        calls += 1
        ran = next(plan)
        if ran is None:
            return
        await asyncio.sleep(ran)
        raise RuntimeError("boom")

    with caplog.at_level(logging.ERROR, logger="reach.worker"):
        await supervised(job, "job", first_backoff_s=0.01, healthy_after_s=0.2)
    waits = [m.split("restarting it in ")[1] for m in caplog.messages if "restarting it in" in m]
    assert calls == 4
    assert waits == ["0.01s", "0.02s", "0.01s"]
