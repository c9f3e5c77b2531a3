"""A task's W3C trace context through every hop, with real processes and no OpenTelemetry in
the worker: submit (given or new), the record, events, status, search, the CLI, retries, the
dead-letter stream and its replay, the HTTP bridge's headers and the gateway's.

(The test process may have OpenTelemetry loaded by tests/test_tracing_otel.py; then a submit's
traceparent is its send span's, a child of the one given: these tests hold the trace id to the
one given and the rest to what the record stores.)
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from broker import BadInput, ReachClient, TaskFailed
from broker.keys import CapabilityKeys
from broker.ops.search import TaskQuery, search_tasks
from broker.settings import Settings
from dlq_tools import DeadLetters
from tests.conftest import ROOT, Fleet, settings_env, wait_until
from tests.gateway_helpers import start_gateway
from tests.trace_handlers import seen

pytestmark = pytest.mark.one_redis

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
GIVEN = f"00-{TRACE}-00f067aa0ba902b7-01"
TRACEPARENT = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
HANDLERS = ["--capability", "trasync=tests.trace_handlers:echo",
            "--capability", "trsync=tests.trace_handlers:echo_sync"]


def stored_trace(r: Any, prefix: str, task_id: str) -> str:
    capability, local = task_id.split(":")
    return str(r.hget(CapabilityKeys(prefix, capability).task(local), "trace"))


@pytest.fixture
def workers(fleet: Fleet) -> Fleet:
    fleet.dispatcher()
    fleet.worker(extra_args=HANDLERS)
    return fleet


def test_a_given_traceparent_runs_through_every_hop(
    workers: Fleet, client: ReachClient, settings: Settings, r: Any, prefix: str,
) -> None:
    handle = client.submit("trasync", {"n": 1}, traceparent=GIVEN, tracestate="vendor=x, other=y")
    about = handle.result(timeout=30)
    stored = stored_trace(r, prefix, handle.task_id)
    assert TRACEPARENT.fullmatch(stored[:55]) and stored[3:35] == TRACE
    assert stored[56:] == "vendor=x,other=y"
    assert about == {"task_id": handle.task_id, "attempt": 1, "trace_id": TRACE,
                     "traceparent": stored[:55], "tracestate": "vendor=x,other=y"}
    assert handle.status().trace_id == TRACE
    events = list(handle.events())
    assert events and {e.trace_id for e in events} == {TRACE}
    page = search_tasks(r, settings, TaskQuery(capability="trasync", trace_id=GIVEN))
    assert [t.task_id for t in page.tasks] == [handle.task_id]
    shown = subprocess.run([sys.executable, "-m", "reach_cli", "status", handle.task_id, "--json"],
                           env=settings_env(settings), cwd=ROOT, capture_output=True, text=True,
                           timeout=60)
    assert json.loads(shown.stdout)["trace_id"] == TRACE, shown.stderr


def test_a_task_without_trace_context_starts_a_trace_of_its_own(
    client: ReachClient, r: Any, prefix: str,
) -> None:
    first, second = client.submit_many("trnew", [{"n": 1}, {"n": 2}])
    third = client.submit("trnew", {"n": 3}, trace_id=TRACE)
    traces = [stored_trace(r, prefix, h.task_id) for h in (first, second, third)]
    assert all(TRACEPARENT.fullmatch(t) for t in traces)
    assert traces[2][3:35] == TRACE
    if "opentelemetry.trace" not in sys.modules:  # (else they share the batch's send span)
        assert traces[0][3:35] != traces[1][3:35]
    assert first.status().trace_id == traces[0][3:35]


def test_retries_keep_the_trace(workers: Fleet, client: ReachClient, r: Any, prefix: str) -> None:
    handle = client.submit("trsync", {"fail_first": True}, traceparent=GIVEN)
    handle.result(timeout=30)
    stored = stored_trace(r, prefix, handle.task_id)
    attempts = [s for s in seen(r, prefix) if s["task_id"] == handle.task_id]
    assert [a["attempt"] for a in attempts] == [1, 2]
    assert {a["traceparent"] for a in attempts} == {stored[:55]}
    assert {a["trace_id"] for a in attempts} == {TRACE}


@pytest.mark.parametrize(("fields", "message"), [
    ({"traceparent": "00-xyz"}, "traceparent must be a W3C traceparent"),
    ({"traceparent": GIVEN.upper()}, "traceparent must be a W3C traceparent"),
    ({"traceparent": f"00-{'0' * 32}-00f067aa0ba902b7-01"}, "all-zero trace id"),
    ({"traceparent": f"00-{TRACE}-{'0' * 16}-01"}, "all-zero parent id"),
    ({"traceparent": f"ff-{TRACE}-00f067aa0ba902b7-01"}, "version ff"),
    ({"traceparent": GIVEN + "-extra"}, "must be 55 characters"),
    ({"traceparent": 42}, "traceparent must be a string"),
    ({"tracestate": "a=1"}, "tracestate needs a traceparent"),
    ({"traceparent": GIVEN, "tracestate": "Bad Key=1"}, "tracestate member"),
    ({"traceparent": GIVEN, "tracestate": "a=1,a=2"}, "names 'a' twice"),
    ({"trace_id": "trace-ok"}, "trace_id must be a W3C trace id"),
    ({"traceparent": GIVEN, "trace_id": "1" * 32}, "different traces"),
])
def test_bad_trace_context_is_refused_and_nothing_is_written(
    client: ReachClient, r: Any, prefix: str, fields: dict[str, Any], message: str,
) -> None:
    with pytest.raises(BadInput, match=message):
        client.submit("trbad", {"n": 1}, **fields)
    with pytest.raises(ValueError, match=message):
        client.submit_many("trbad", [{"n": 1}, {"n": 2}], **fields)
    assert not list(r.scan_iter(f"{prefix}:*"))


def test_a_replayed_dead_letter_keeps_its_trace(
    workers: Fleet, client: ReachClient, settings: Settings, r: Any, prefix: str,
) -> None:
    handle = client.submit("trasync", {"fail": True}, traceparent=GIVEN)
    with pytest.raises(TaskFailed):
        handle.result(timeout=30)
    stored = stored_trace(r, prefix, handle.task_id)
    with DeadLetters(settings) as d:
        detail = d.get(handle.task_id)
        assert detail.cli_dict(d.now_ms())["trace_id"] == TRACE
        assert {e["trace_id"] for e in detail.events} == {TRACE}
        assert d.replay(d.select([handle.task_id])).counts() == {"replayed": 1}
    wait_until(lambda: len([s for s in seen(r, prefix) if s["task_id"] == handle.task_id]) == 2,
               30, message="the replayed task run again")
    attempts = [s for s in seen(r, prefix) if s["task_id"] == handle.task_id]
    assert {a["traceparent"] for a in attempts} == {stored[:55]}
    assert handle.status().trace_id == TRACE


class _Agent(BaseHTTPRequestHandler):
    """An HTTP agent that answers success and keeps the headers of every request."""

    seen: list[dict[str, str]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        _Agent.seen.append({k.lower(): v for k, v in self.headers.items()} | {"_body": body.decode()})
        answer = json.dumps({"status": "success", "result": {"ok": True}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def http_agent() -> Iterator[str]:
    _Agent.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Agent)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_http_bridge_sends_the_attempts_traceparent(
    fleet: Fleet, http_agent: str, client: ReachClient, r: Any, prefix: str,
) -> None:
    fleet.dispatcher()
    fleet.worker("trhttp", extra_args=["--http", f"{http_agent}/process"])
    handle = client.submit("trhttp", {"n": 1}, traceparent=GIVEN, tracestate="vendor=x")
    assert handle.result(timeout=30) == {"ok": True}
    stored = stored_trace(r, prefix, handle.task_id)
    (request,) = [h for h in _Agent.seen if h.get("x-reach-task-id") == handle.task_id]
    assert request["traceparent"] == stored[:55] and request["traceparent"][3:35] == TRACE
    assert request["tracestate"] == "vendor=x"
    assert request["x-reach-trace-id"] == TRACE
    assert json.loads(request["_body"])["trace_id"] == TRACE


def test_the_gateway_takes_trace_context_from_headers_or_fields(
    fleet: Fleet, client: ReachClient, r: Any, prefix: str,
) -> None:
    _, base = start_gateway(fleet)
    with httpx.Client(base_url=base, timeout=30) as http:
        by_header = http.post("/v1/tasks", json={"capability": "trgw", "payload": {"n": 1}},
                              headers={"traceparent": GIVEN, "tracestate": "vendor=x"})
        assert by_header.status_code == 202, by_header.text
        other = f"00-{'1' * 32}-00f067aa0ba902b7-01"
        by_field = http.post("/v1/tasks", json={"capability": "trgw", "payload": {"n": 2},
                                                "traceparent": other})
        assert by_field.status_code == 202, by_field.text
        batch = http.post("/v1/tasks/batch", json={"capability": "trgw", "payloads": [1, 2]},
                          headers={"traceparent": GIVEN})
        assert batch.status_code == 202, batch.text
        index = CapabilityKeys(prefix, "trgw").tasks
        assert r.zcard(index) == 4
        bad = http.post("/v1/tasks", json={"capability": "trgw", "payload": {}},
                        headers={"traceparent": "00-nope"})
        assert bad.status_code == 422 and "traceparent" in bad.json()["error"]["message"], bad.text
        differ = http.post("/v1/tasks", json={"capability": "trgw", "payload": {}, "traceparent": other},
                           headers={"traceparent": GIVEN})
        assert differ.status_code == 422 and differ.json()["error"]["field"] == "traceparent"
        assert r.zcard(index) == 4  # (nothing more was queued)
    header_task = by_header.json()["task_id"]
    assert client.status(header_task).trace_id == TRACE
    assert stored_trace(r, prefix, header_task)[56:] == "vendor=x"
    assert client.status(by_field.json()["task_id"]).trace_id == "1" * 32
    assert {client.status(t["task_id"]).trace_id for t in batch.json()["tasks"]} == {TRACE}


PRODUCER_IN_A_SPAN = """
import sys
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from broker import ReachClient
# (the API alone, no tracer provider: a span context someone else made current)
parent = SpanContext(int(sys.argv[1], 16), 0x00F067AA0BA902B7, is_remote=True,
                     trace_flags=TraceFlags(1))
with ReachClient() as client, trace.use_span(NonRecordingSpan(parent)):
    print(client.submit("trapi", {"n": 1}).task_id)
"""


def test_without_a_tracer_provider_a_task_joins_the_current_spans_trace(
    settings: Settings, r: Any, prefix: str,
) -> None:
    pytest.importorskip("opentelemetry.trace", reason="the otel extra is not installed")
    done = subprocess.run([sys.executable, "-c", PRODUCER_IN_A_SPAN, TRACE], env=settings_env(settings),
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert stored_trace(r, prefix, done.stdout.strip()) == GIVEN
