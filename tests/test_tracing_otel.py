"""OpenTelemetry across real processes: the producer here (the SDK recording in memory), a
`reach-worker` subprocess with the SDK exporting to a file (tests/trace_handlers.py), a real
dispatcher. One trace holds the `send` span and one `process` span per attempt, each a child
of the send span, and the handler's own spans are children of its attempt's span.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk.trace", reason="the otel extra is not installed")

from opentelemetry import trace

from broker import ReachClient
from broker.settings import Settings
from tests.conftest import Fleet, wait_until
from tests.otel_spans import Recorder, read_spans, recorder
from tests.trace_handlers import seen

pytestmark = pytest.mark.one_redis

HANDLERS = ["--capability", "otelasync=tests.trace_handlers:echo",
            "--capability", "otelsync=tests.trace_handlers:echo_sync"]


@pytest.fixture
def spans(tmp_path: Path) -> Path:
    return tmp_path / "worker-spans.jsonl"


@pytest.fixture
def recording() -> Iterator[Recorder]:
    rec = recorder()
    rec.spans.clear()
    rec.recording = True
    yield rec
    rec.recording = False


@pytest.fixture
def traced_fleet(fleet: Fleet, spans: Path) -> Fleet:
    fleet.dispatcher()
    fleet.worker(agent_id=f"otel-{secrets.token_hex(2)}", extra_args=HANDLERS,
                 env={"REACH_TEST_SPANS": str(spans)})
    return fleet


def _process_spans(path: Path, task_id: str, n: int) -> list[dict[str, Any]]:
    def found() -> list[dict[str, Any]] | None:
        mine = [s for s in read_spans(path) if s["kind"] == "CONSUMER"
                and s["attributes"].get("messaging.message.id") == task_id]
        return mine if len(mine) >= n else None

    spans: list[dict[str, Any]] = wait_until(found, 30, message=f"{n} process span(s) of {task_id}")
    return sorted(spans, key=lambda s: s["attributes"]["reach.attempt"])


def _children(path: Path, parent: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in read_spans(path) if s["parent_id"] == parent["span_id"]]


def test_a_task_is_one_trace_from_send_to_process(
    traced_fleet: Fleet, settings: Settings, spans: Path, recording: Recorder,
) -> None:
    agent_id = traced_fleet.procs[-1].agent_id
    with ReachClient(settings) as client:
        handle = client.submit("otelasync", {"n": 1})
        about = handle.result(timeout=30)
    (send,) = [s for s in recording.spans if s["name"] == "send otelasync"]
    assert send["kind"] == "PRODUCER" and send["status"] != "ERROR"
    assert send["attributes"]["messaging.system"] == "reach"
    assert send["attributes"]["messaging.destination.name"] == "otelasync"
    assert send["attributes"]["messaging.message.id"] == handle.task_id
    assert handle.status().trace_id == send["trace_id"]

    (process,) = _process_spans(spans, handle.task_id, 1)
    assert process["name"] == "process otelasync"
    assert (process["trace_id"], process["parent_id"]) == (send["trace_id"], send["span_id"])
    assert process["attributes"] == {
        "messaging.system": "reach", "messaging.destination.name": "otelasync",
        "messaging.operation.type": "process", "messaging.operation.name": "process",
        "messaging.message.id": handle.task_id, "reach.attempt": 1, "reach.agent_id": agent_id,
        "reach.outcome": "success"}
    assert process["status"] == "OK"
    assert [e["name"] for e in process["events"]] == ["dispatch"]
    assert process["events"][0]["time_ns"] <= process["start_ns"]
    # The handler ran under the process span: its context names it, its own span is its child.
    assert about["traceparent"][:53] == f"00-{send['trace_id']}-{process['span_id']}-"
    assert int(about["traceparent"][53:], 16) & 1  # (sampled; newer SDKs also set "random")
    (own,) = _children(spans, process)
    assert own["name"] == "handler async" and own["trace_id"] == send["trace_id"]


def test_a_retried_task_shows_one_process_span_per_attempt(
    traced_fleet: Fleet, settings: Settings, spans: Path, recording: Recorder, r: Any, prefix: str,
) -> None:
    with ReachClient(settings) as client:
        handle = client.submit("otelsync", {"fail_first": True})
        handle.result(timeout=30)
    (send,) = [s for s in recording.spans if s["name"] == "send otelsync"]
    first, second = _process_spans(spans, handle.task_id, 2)
    for attempt, span in ((1, first), (2, second)):
        assert (span["trace_id"], span["parent_id"]) == (send["trace_id"], send["span_id"])
        assert span["attributes"]["reach.attempt"] == attempt
        # a sync handler's span, made in its thread, is a child of its attempt's span
        (own,) = _children(spans, span)
        assert own["name"] == "handler sync"
    assert first["status"] == "ERROR"
    assert first["status_text"].startswith("retryable_failure: Retryable: first attempt fails on purpose")
    assert first["attributes"]["error.type"] == "retryable_failure"
    assert second["status"] == "OK"
    assert [e["name"] for e in first["events"]] == ["dispatch"]
    assert [e["name"] for e in second["events"]] == ["dispatch", "retry"]
    contexts = [s for s in seen(r, prefix) if s["task_id"] == handle.task_id]
    assert [c["traceparent"][36:52] for c in contexts] == [first["span_id"], second["span_id"]]


def test_the_send_span_is_a_child_of_the_current_span_or_a_given_traceparent(
    traced_fleet: Fleet, settings: Settings, spans: Path, recording: Recorder,
) -> None:
    with ReachClient(settings) as client:
        with trace.get_tracer("tests").start_as_current_span("request") as outer:
            inside = client.submit("otelasync", {"n": 2})
        given = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        explicit = client.submit("otelasync", {"n": 3}, traceparent=given, tracestate="vendor=x")
        inside.result(timeout=30)
        explicit.result(timeout=30)
    outer_ctx = outer.get_span_context()
    sends = {s["attributes"]["messaging.message.id"]: s for s in recording.spans
             if s["name"] == "send otelasync"}
    assert sends[inside.task_id]["parent_id"] == f"{outer_ctx.span_id:016x}"
    assert sends[inside.task_id]["trace_id"] == f"{outer_ctx.trace_id:032x}"
    assert sends[explicit.task_id]["parent_id"] == "b7ad6b7169203331"
    assert explicit.status().trace_id == "0af7651916cd43dd8448eb211c80319c"
    for handle in (inside, explicit):
        (process,) = _process_spans(spans, handle.task_id, 1)
        assert process["parent_id"] == sends[handle.task_id]["span_id"]


def test_an_invalid_traceparent_starts_no_span_and_writes_nothing(
    settings: Settings, recording: Recorder, r: Any, prefix: str,
) -> None:
    from broker import BadInput

    with ReachClient(settings) as client, pytest.raises(BadInput, match="traceparent"):
        client.submit("otelasync", {"n": 4}, traceparent="00-xyz")
    assert recording.spans == []
    assert not list(r.scan_iter(f"{prefix}:*task*"))


def test_the_attempt_after_a_reclaim_says_so(
    fleet: Fleet, settings: Settings, tmp_path: Path, recording: Recorder, r: Any, prefix: str,
) -> None:
    fleet.dispatcher()
    first_spans, second_spans = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    first = fleet.worker(extra_args=HANDLERS, env={"REACH_TEST_SPANS": str(first_spans)})
    with ReachClient(settings) as client:
        handle = client.submit("otelasync", {"hang_first": True})
        wait_until(lambda: any(s["task_id"] == handle.task_id for s in seen(r, prefix)), 30,
                   message="the first attempt running")
        first.kill()
        fleet.worker(extra_args=HANDLERS, env={"REACH_TEST_SPANS": str(second_spans)})
        handle.result(timeout=60)
    (send,) = [s for s in recording.spans if s["name"] == "send otelasync"]
    (process,) = _process_spans(second_spans, handle.task_id, 1)
    assert (process["trace_id"], process["parent_id"]) == (send["trace_id"], send["span_id"])
    assert process["attributes"]["reach.attempt"] == 2 and process["status"] == "OK"
    assert [e["name"] for e in process["events"]] == ["dispatch", "reclaim", "retry"]
