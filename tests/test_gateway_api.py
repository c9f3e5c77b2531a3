"""The gateway's API end to end: a real `reach serve`, dispatcher and worker (processes) and real
HTTP, with and without API keys.

One stack per module (starting it costs seconds); each test uses capabilities of its own.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from broker.ops import policy
from broker.ops.catalog import capability_rows
from broker.ops.overview import agent_rows, queue_rows
from broker.scripts import Scripts
from broker.settings import Settings
from gateway.apikeys import Role, create_key, revoke_key
from gateway.state import REDIS_CONNECTIONS
from tests.conftest import FAST, Fleet, _delete_prefix, sync_redis, wait_until
from tests.gateway_helpers import bearer, sse_events, start_gateway

pytestmark = pytest.mark.one_redis

CAP = "gwwork"
QUEUE_LIMIT = 40
STREAMS = 200


class Stack:
    def __init__(self, settings: Settings, fleet: Fleet, url: str) -> None:
        self.settings = settings
        self.fleet = fleet
        self.url = url
        self.http = httpx.Client(base_url=url, timeout=30)

    def submit(self, payload: Any, capability: str = CAP, **fields: Any) -> str:
        reply = self.http.post("/v1/tasks", json={"capability": capability, "payload": payload, **fields})
        assert reply.status_code == 202, reply.text
        return str(reply.json()["task_id"])

    def result(self, task_id: str, wait: float = 20) -> httpx.Response:
        return self.http.get(f"/v1/tasks/{task_id}/result", params={"wait": wait})


@pytest.fixture(scope="module")
def stack(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    prefix = f"t{secrets.token_hex(4)}"
    settings = Settings.load(redis_url=redis_url, prefix=prefix, **FAST)
    fleet = Fleet(settings, tmp_path_factory.mktemp("gateway"))
    try:
        fleet.dispatcher()
        fleet.worker(CAP, handler="tests.gateway_handlers:work", concurrency=8)
        _, url = start_gateway(fleet)
        s = Stack(settings, fleet, url)
        yield s
        s.http.close()
    except BaseException:
        for proc in fleet.procs:
            sys.stderr.write(f"\n----- {proc.name} -----\n{proc.output()[-3000:]}\n")
        raise
    finally:
        fleet.stop_all()
        _delete_prefix(redis_url, prefix)


@pytest.fixture
def keys(stack: Stack) -> Iterator[Callable[[Role], str]]:
    """Makes keys (the gateway then needs one on every call); revokes them after the test."""
    made: list[str] = []
    client = sync_redis(stack.settings.redis_url)

    def make(role: Role) -> str:
        key, record = create_key(client, stack.settings, role, "test")
        made.append(record.id)
        return key

    yield make
    for key_id in made:
        revoke_key(client, stack.settings, key_id)
    client.close()
    wait_until(lambda: stack.http.get("/v1/agents").status_code == 200, 5, message="the gateway open again")


def test_submit_wait_and_read_a_task(stack: Stack) -> None:
    task_id = stack.submit({"x": 1}, priority=7, metadata={"m": 1})
    done = stack.result(task_id)
    assert done.status_code == 200
    assert done.json() == {"task_id": task_id, "state": "succeeded", "result": {"x": 1}}
    assert "server" not in done.headers  # (the gateway does not advertise its server software)
    status = stack.http.get(f"/v1/tasks/{task_id}").json()
    assert list(status) == ["task_id", "capability", "state", "priority", "attempt", "agent_id",
                            "created_at", "finished_at", "reason", "error",
                            "progress_dropped"]  # (reach status --json)
    assert (status["state"], status["priority"], status["attempt"]) == ("succeeded", 7, 1)


def test_a_failed_task_answers_its_reason_and_an_unfinished_one_202(stack: Stack) -> None:
    failed = stack.submit({"invalid": "no text"})
    reply = stack.result(failed)
    assert reply.status_code == 200
    assert reply.json()["state"] == "failed" and reply.json()["reason"] == "invalid_request"
    assert "no text" in reply.json()["error"]
    waiting = stack.submit({"x": 1}, capability="gwnobody")
    started = time.monotonic()
    reply = stack.result(waiting, wait=0.5)
    assert reply.status_code == 202 and reply.json() == {"task_id": waiting, "state": "queued"}
    assert 0.4 < time.monotonic() - started < 5


def test_the_wait_of_a_long_poll_is_checked_naming_it(stack: Stack) -> None:
    task_id = stack.submit({"x": 1}, capability="gwnobody")
    for wait in ("61", "-1", "nan", "inf", "1e400", "soon", ""):
        reply = stack.http.get(f"/v1/tasks/{task_id}/result", params={"wait": wait})
        assert reply.status_code == 422, (wait, reply.text)
        error = reply.json()["error"]
        assert error["field"] == "wait" and error["message"].startswith("wait: "), error
    last = stack.http.get(f"/v1/tasks/{task_id}/result?wait=x&wait=0")  # (the last one counts)
    assert last.status_code == 202 and last.json() == {"task_id": task_id, "state": "queued"}
    assert stack.http.post(f"/v1/tasks/{task_id}/result").status_code == 405
    assert stack.http.get("/v1/tasks/not-an-id/result").json()["error"]["field"] == "task_id"


_UNDER_A_PREFIX = """
import uvicorn
from broker.settings import Settings
from gateway.app import create_app
from gateway.server import bind, url_of
sock = bind("127.0.0.1", 0)
print("listening on", url_of(sock), flush=True)
uvicorn.Server(uvicorn.Config(create_app(Settings.load()), root_path="/gw", log_level="warning")
               ).run(sockets=[sock])
"""


def test_under_a_root_path_the_framework_routes_answer_as_the_hot_ones(stack: Stack) -> None:
    # (gateway/hot.py steps aside for an app served under a root_path: FastAPI's routes for
    # submit and the result answer, through the same functions)
    proc = stack.fleet.spawn("gateway-root-path", [sys.executable, "-c", _UNDER_A_PREFIX], stack.settings)

    def url() -> str | None:
        lines = [line for line in proc.output().splitlines() if line.startswith("listening on ")]
        return lines[0].split()[-1] if lines else None

    with httpx.Client(base_url=str(wait_until(url, 30, message="the URL")), timeout=30) as http:
        wait_until(lambda: http.get("/healthz").status_code == 200, 30, message="the gateway answering")
        reply = http.post("/v1/tasks", json={"capability": CAP, "payload": {"x": 2}})
        assert reply.status_code == 202 and reply.json()["state"] == "queued", reply.text
        task_id = reply.json()["task_id"]
        done = http.get(f"/v1/tasks/{task_id}/result", params={"wait": 20})
        assert done.json() == {"task_id": task_id, "state": "succeeded", "result": {"x": 2}}
        bad = http.post("/v1/tasks", json={"capability": "Bad Name", "payload": 1})
        assert bad.status_code == 422 and bad.json()["error"]["field"] == "capability"
        nan = http.post("/v1/tasks", content=b'{"capability": "gwwork", "payload": NaN}')
        assert nan.status_code == 400 and nan.json()["error"]["code"] == "invalid_json"
        form = {"Content-Type": "application/x-www-form-urlencoded"}
        assert http.post("/v1/tasks", content=b"x=1", headers=form).status_code == 415
        wait = http.get(f"/v1/tasks/{task_id}/result", params={"wait": "61"})
        assert wait.status_code == 422 and wait.json()["error"]["field"] == "wait"


def test_cancel(stack: Stack) -> None:
    task_id = stack.submit({"x": 1}, capability="gwnobody")
    reply = stack.http.post(f"/v1/tasks/{task_id}/cancel")
    assert reply.json() == {"task_id": task_id, "canceled": True, "state": "canceled"}
    assert stack.result(task_id).json()["state"] == "canceled"
    assert stack.http.post(f"/v1/tasks/{task_id}/cancel").json()["canceled"] is False


def test_idempotency_key_header_returns_the_first_task(stack: Stack) -> None:
    key = {"Idempotency-Key": secrets.token_hex(8)}
    first = stack.http.post("/v1/tasks", json={"capability": CAP, "payload": 1}, headers=key).json()
    again = stack.http.post("/v1/tasks", json={"capability": CAP, "payload": 2}, headers=key).json()
    assert first["created"] is True and again["created"] is False
    assert again["task_id"] == first["task_id"]
    clash = stack.http.post("/v1/tasks", json={"capability": CAP, "payload": 1, "idempotency_key": "other"},
                            headers=key)
    assert clash.status_code == 422 and clash.json()["error"]["field"] == "idempotency_key"


def test_batch_submits_up_to_a_thousand(stack: Stack) -> None:
    payloads = [{"i": i} for i in range(1000)]
    reply = stack.http.post("/v1/tasks/batch", json={"capability": CAP, "payloads": payloads})
    assert reply.status_code == 202
    tasks = reply.json()["tasks"]
    assert len(tasks) == 1000 and len({t["task_id"] for t in tasks}) == 1000
    assert stack.result(tasks[-1]["task_id"]).json()["result"] == {"i": 999}
    over = stack.http.post("/v1/tasks/batch", json={"capability": CAP, "payloads": [1] * 1001})
    assert over.status_code == 422 and over.json()["error"]["field"] == "payloads"


@pytest.mark.parametrize("body, status, code, field", [
    ({"capability": "Bad Name", "payload": 1}, 422, "invalid_request", "capability"),
    ({"capability": CAP, "payload": 1, "priority": 10}, 422, "invalid_request", "priority"),
    ({"capability": CAP, "payload": 1, "priority": "7"}, 422, "invalid_request", "priority"),
    ({"capability": CAP, "payload": 1, "colour": "red"}, 422, "invalid_request", "colour"),
    ({"capability": CAP}, 422, "invalid_request", "payload"),
    ({"capability": CAP, "payload": 1, "version": "not a version"}, 422, "invalid_request", None),
    ({"capability": CAP, "payload": 1, "at": "2020-01-01T00:00:00"}, 422, "invalid_request", None),
])
def test_bad_input_is_refused_naming_the_field(stack: Stack, body: dict[str, Any], status: int,
                                               code: str, field: str | None) -> None:
    reply = stack.http.post("/v1/tasks", json=body)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert error["code"] == code and error["message"]
    if field is not None:
        assert error["field"] == field


def test_strict_json_size_limits_and_media_type(stack: Stack) -> None:
    headers = {"Content-Type": "application/json"}
    nan = stack.http.post("/v1/tasks", content=b'{"capability": "gwwork", "payload": NaN}', headers=headers)
    assert nan.status_code == 400 and nan.json()["error"]["code"] == "invalid_json"
    assert "NaN" in nan.json()["error"]["message"]
    broken = stack.http.post("/v1/tasks", content=b'{"capability": ', headers=headers)
    assert broken.status_code == 400
    big = stack.http.post("/v1/tasks", json={"capability": CAP, "payload": "x" * (1 << 20)})
    assert big.status_code == 413 and big.json()["error"]["code"] == "payload_too_large"
    huge = stack.http.post("/v1/tasks", content=b" " * (3 << 20), headers=headers)
    assert huge.status_code == 413
    form = stack.http.post("/v1/tasks", content=b"capability=x", headers={
        "Content-Type": "application/x-www-form-urlencoded"})
    assert form.status_code == 415
    bare = stack.http.post("/v1/tasks", content=json.dumps({"capability": CAP, "payload": 3}).encode())
    assert bare.status_code == 202  # (no Content-Type at all: read as JSON)


def test_unknown_and_malformed_task_ids(stack: Stack) -> None:
    unknown = f"{CAP}:01JB0000000000000000000000"
    for path in ("", "/result", "/events"):
        reply = stack.http.get(f"/v1/tasks/{unknown}{path}")
        assert reply.status_code == 404 and reply.json()["error"]["code"] == "unknown_task", path
    assert stack.http.post(f"/v1/tasks/{unknown}/cancel").status_code == 404
    malformed = stack.http.get("/v1/tasks/not-an-id")
    assert malformed.status_code == 422 and malformed.json()["error"]["field"] == "task_id"
    assert stack.http.get("/v1/nothing").json()["error"]["code"] == "not_found"


def test_a_full_queue_answers_429_with_retry_after(stack: Stack) -> None:
    capability = f"gwfull{secrets.token_hex(2)}"
    client = sync_redis(stack.settings.redis_url)
    try:
        policy.set_fields(client, Scripts(client), stack.settings, capability,
                          {"max_queue_depth": QUEUE_LIMIT})
    finally:
        client.close()
    reply = stack.http.post("/v1/tasks/batch", json={"capability": capability, "payloads": [1] * QUEUE_LIMIT})
    assert reply.status_code == 202
    full = stack.http.post("/v1/tasks", json={"capability": capability, "payload": 1})
    assert full.status_code == 429 and full.json()["error"]["code"] == "queue_full"
    assert full.headers["Retry-After"] == "1"


def test_events_stream_as_sse_and_end_after_the_terminal_event(stack: Stack) -> None:
    task_id = stack.submit({"steps": 3, "step_ms": 20})
    with stack.http.stream("GET", f"/v1/tasks/{task_id}/events") as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = list(sse_events(response))
    types = [e["event"] for e in events]
    assert types[0] == "queued" and types[-1] == "succeeded" and types.count("progress") == 3
    assert [int(e["id"]) for e in events] == list(range(1, len(events) + 1))
    assert all(e["data"]["seq"] == int(e["id"]) and e["data"]["task_id"] == task_id for e in events)


def test_sse_resumes_after_last_event_id_losing_and_repeating_nothing(stack: Stack) -> None:
    task_id = stack.submit({"steps": 8, "step_ms": 60})
    seen: list[dict[str, Any]] = []
    with stack.http.stream("GET", f"/v1/tasks/{task_id}/events") as response:
        for event in sse_events(response):
            seen.append(event)
            if len(seen) == 4:
                break  # (the client drops the connection mid-stream)
    reconnects = 0
    while seen[-1]["event"] != "succeeded":
        reconnects += 1
        headers = {"Last-Event-ID": seen[-1]["id"]}
        with stack.http.stream("GET", f"/v1/tasks/{task_id}/events", headers=headers) as response:
            for event in sse_events(response):
                seen.append(event)
                if reconnects < 3 and event["event"] == "progress":
                    break
    assert reconnects >= 2
    assert [int(e["id"]) for e in seen] == list(range(1, len(seen) + 1))  # nothing lost, nothing twice
    assert [e["event"] for e in seen].count("progress") == 8
    with stack.http.stream("GET", f"/v1/tasks/{task_id}/events",
                           headers={"Last-Event-ID": seen[-1]["id"]}) as response:
        assert list(sse_events(response)) == []  # resumed after the end: the stream just ends
    assert stack.http.get(f"/v1/tasks/{task_id}/events", headers={"Last-Event-ID": "x"}).status_code == 422


def test_many_streams_at_once_share_the_gateways_redis_connections(stack: Stack) -> None:
    reply = stack.http.post("/v1/tasks/batch", json={"capability": CAP, "payloads": [
        {"steps": 2, "step_ms": 20}] * STREAMS})
    ids = [t["task_id"] for t in reply.json()["tasks"]]
    client = sync_redis(stack.settings.redis_url)
    before = int(client.info("clients")["connected_clients"])

    async def follow(http: httpx.AsyncClient, task_id: str) -> list[str]:
        async with http.stream("GET", f"/v1/tasks/{task_id}/events") as response:
            assert response.status_code == 200
            return [line for line in [x async for x in response.aiter_lines()] if line.startswith("event:")]

    async def all_streams() -> list[list[str]]:
        limits = httpx.Limits(max_connections=STREAMS + 10)
        async with httpx.AsyncClient(base_url=stack.url, timeout=60, limits=limits) as http:
            return await asyncio.gather(*(follow(http, t) for t in ids))

    try:
        streams = asyncio.run(all_streams())
        grown = int(client.info("clients")["connected_clients"]) - before
    finally:
        client.close()
    assert all(s[-1] == "event: succeeded" and s.count("event: progress") == 2 for s in streams)
    # (the gateway's pool holds at most REDIS_CONNECTIONS; the worker and dispatcher add a few)
    assert grown <= REDIS_CONNECTIONS + 20 < STREAMS, f"{STREAMS} streams opened {grown} Redis connections"


def test_fleet_endpoints_have_the_cli_json_shapes(stack: Stack) -> None:
    client = sync_redis(stack.settings.redis_url)
    try:
        for path, rows in (("/v1/agents", agent_rows), ("/v1/queues", queue_rows),
                           ("/v1/capabilities", capability_rows)):
            reply = stack.http.get(path)
            assert reply.status_code == 200
            expected = rows(client, stack.settings)
            assert [set(item) for item in reply.json()] == [set(r.as_dict()) for r in expected], path
    finally:
        client.close()
    agents = stack.http.get("/v1/agents", params={"capability": CAP}).json()
    assert [a["capabilities"] for a in agents] == [[CAP]] and agents[0]["state"] == "healthy"
    assert stack.http.get("/v1/queues", params={"capability": "Bad!"}).status_code == 422


def test_keys_wrong_key_401_reader_cannot_submit_403(stack: Stack, keys: Callable[[Role], str]) -> None:
    producer, reader, operator = keys(Role.PRODUCER), keys(Role.READER), keys(Role.OPERATOR)
    body = {"capability": CAP, "payload": {"k": 1}}

    def needs_key() -> bool:
        return stack.http.get("/v1/agents").status_code == 401

    wait_until(needs_key, 5, message="the gateway asking for keys once one exists")
    anonymous = stack.http.post("/v1/tasks", json=body)
    assert anonymous.status_code == 401 and anonymous.headers["WWW-Authenticate"] == "Bearer"
    wrong = stack.http.post("/v1/tasks", json=body, headers=bearer("rk_" + "x" * 43))
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "unauthorized"
    denied = stack.http.post("/v1/tasks", json=body, headers=bearer(reader))
    assert denied.status_code == 403 and denied.json()["error"]["code"] == "forbidden"
    submitted = stack.http.post("/v1/tasks", json=body, headers=bearer(producer))
    assert submitted.status_code == 202
    task_id = submitted.json()["task_id"]
    assert stack.http.get(f"/v1/tasks/{task_id}/result", params={"wait": 20},
                          headers=bearer(reader)).json()["result"] == {"k": 1}
    assert stack.http.get("/v1/queues", headers=bearer(reader)).status_code == 200
    assert stack.http.post(f"/v1/tasks/{task_id}/cancel", headers=bearer(reader)).status_code == 403
    assert stack.http.post(f"/v1/tasks/{task_id}/cancel", headers=bearer(operator)).status_code == 200
    assert stack.http.get("/healthz").status_code == 200  # (open: a health check carries no key)


def test_a_revoked_key_stops_working(stack: Stack, keys: Callable[[Role], str]) -> None:
    client = sync_redis(stack.settings.redis_url)
    try:
        key, record = create_key(client, stack.settings, Role.READER)
        keys(Role.OPERATOR)  # (keeps keys required once this one is revoked)
        assert stack.http.get("/v1/agents", headers=bearer(key)).status_code == 200
        revoke_key(client, stack.settings, record.id)
    finally:
        client.close()
    wait_until(lambda: stack.http.get("/v1/agents", headers=bearer(key)).status_code == 401, 5,
               message="the revoked key refused")


def test_openapi_and_docs_are_served(stack: Stack) -> None:
    schema = stack.http.get("/openapi.json").json()
    for path in ("/v1/tasks", "/v1/tasks/batch", "/v1/tasks/{task_id}", "/v1/tasks/{task_id}/result",
                 "/v1/tasks/{task_id}/events", "/v1/tasks/{task_id}/cancel", "/v1/capabilities",
                 "/v1/agents", "/v1/queues", "/v1/callbacks/{task_id}"):
        assert path in schema["paths"], path
    assert "HTTPBearer" in schema["components"]["securitySchemes"]
    assert stack.http.get("/docs").status_code == 200


def test_redis_unavailable_answers_503(fleet: Fleet, tmp_path: Path) -> None:
    import socket

    with socket.socket() as sock:  # (a port nothing listens on)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    away = Settings.load(redis_url=f"redis://127.0.0.1:{port}/0", prefix="gwaway")
    _, url = start_gateway(fleet, away)
    with httpx.Client(base_url=url, timeout=30) as http:
        assert http.get("/healthz").status_code == 503
        reply = http.get(f"/v1/tasks/{CAP}:01JB0000000000000000000000")
        assert reply.status_code == 503 and reply.json()["error"]["code"] == "unavailable"
        assert reply.headers["Retry-After"] == "1"
        assert http.get("/v1/agents").status_code == 503


def test_a_gateway_on_a_non_loopback_address_needs_a_key(fleet: Fleet, settings: Settings) -> None:
    from tests.conftest import settings_env

    argv = [sys.executable, "-m", "reach_cli", "serve", "--addr", "0.0.0.0:0"]
    refused = subprocess.run(argv, env=settings_env(settings), capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2
    assert "refusing to serve on 0.0.0.0" in refused.stderr and "--insecure-no-auth" in refused.stderr
    client = sync_redis(settings.redis_url)
    try:
        key, _ = create_key(client, settings, Role.READER)
    finally:
        client.close()
    _, url = start_gateway(fleet, settings, "--addr", "0.0.0.0:0")  # (the last --addr wins)
    assert httpx.get(f"{url}/v1/agents", timeout=10).status_code == 401
    assert httpx.get(f"{url}/v1/agents", headers=bearer(key), timeout=10).status_code == 200
