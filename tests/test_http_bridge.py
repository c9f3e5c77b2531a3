"""The HTTP bridge against a real HTTP agent in another language: examples/http-agent/agent.js
(Node.js) as a process behind `reach-worker --http`, with a real dispatcher and gateway.

One stack per module: the agent, a gateway, a dispatcher, and two workers in front of the agent:
`words` (concurrency 16, readiness probe, callbacks through the gateway, an Authorization header
from the environment) and `wordspoll` (no callback URL: an accepted task is polled at once).
"""

from __future__ import annotations

import secrets
import socket
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import httpx
import pytest

from broker.registry import AgentState
from broker.settings import Settings
from tests.conftest import FAST, Fleet, Proc, _delete_prefix, agent_state_of, wait_until
from tests.gateway_helpers import start_gateway, start_node_agent

pytestmark = pytest.mark.one_redis

SECRET = "s3cret-" + secrets.token_hex(4)


class Stack:
    def __init__(self, settings: Settings, fleet: Fleet, gateway: str, agent: str, words: Proc) -> None:
        self.settings = settings
        self.fleet = fleet
        self.gateway = gateway
        self.agent = agent
        self.words = words
        self.http = httpx.Client(base_url=gateway, timeout=30)

    def submit(self, payload: Any, capability: str = "words", **fields: Any) -> str:
        reply = self.http.post("/v1/tasks", json={"capability": capability, "payload": payload, **fields})
        assert reply.status_code == 202, reply.text
        return str(reply.json()["task_id"])

    def result(self, task_id: str, wait: float = 30) -> dict[str, Any]:
        reply = self.http.get(f"/v1/tasks/{task_id}/result", params={"wait": wait})
        assert reply.status_code == 200, reply.text
        body: dict[str, Any] = reply.json()
        return body

    def events(self, task_id: str) -> list[dict[str, Any]]:
        from tests.gateway_helpers import sse_events

        with self.http.stream("GET", f"/v1/tasks/{task_id}/events") as response:
            return [e["data"] for e in sse_events(response)]

    def accepted(self, task_id: str) -> list[dict[str, Any]]:
        """What the agent's accepted requests carried (tokens, callback URLs), for this task."""
        entries = httpx.get(f"{self.agent}/admin/accepted", timeout=5).json()
        return [e for e in entries if e["task_id"] == task_id]


@pytest.fixture(scope="module")
def stack(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    prefix = f"t{secrets.token_hex(4)}"
    settings = Settings.load(redis_url=redis_url, prefix=prefix, **FAST)
    fleet = Fleet(settings, tmp_path_factory.mktemp("bridge"))
    try:
        _, agent = start_node_agent(fleet)
        _, gateway = start_gateway(fleet)
        fleet.dispatcher()
        words = fleet.worker("words", concurrency=16, env={"AGENT_TOKEN": SECRET}, extra_args=[
            "--http", f"{agent}/process", "--http-ready", "auto", "--http-callback-url", gateway,
            "--http-poll-after", "1.5", "--http-header", "Authorization: Bearer ${AGENT_TOKEN}"])
        fleet.worker("wordspoll", concurrency=4, extra_args=["--http", f"{agent}/process"])
        s = Stack(settings, fleet, gateway, agent, words)
        yield s
        s.http.close()
    except BaseException:
        for proc in fleet.procs:
            sys.stderr.write(f"\n----- {proc.name} -----\n{proc.output()[-3000:]}\n")
        raise
    finally:
        fleet.stop_all()
        _delete_prefix(redis_url, prefix)


def test_sixteen_one_second_calls_at_concurrency_16_take_about_a_second(stack: Stack) -> None:
    stack.result(stack.submit({"text": "warm up"}))  # (connections made, agent seen)
    started = time.monotonic()
    reply = stack.http.post("/v1/tasks/batch", json={
        "capability": "words", "payloads": [{"text": f"task {i}", "sleep_ms": 1000} for i in range(16)]})
    ids = [t["task_id"] for t in reply.json()["tasks"]]
    results = [stack.result(task_id) for task_id in ids]
    elapsed = time.monotonic() - started
    assert all(r["state"] == "succeeded" for r in results)
    assert elapsed < 2.0, f"16 one-second calls took {elapsed:.2f}s at concurrency 16"


def test_business_status_and_http_status_decide_the_outcome(stack: Stack) -> None:
    ok = stack.result(stack.submit({"text": "three little words"}))
    assert ok["result"] == {"words": 3, "longest": "little"}
    bad = stack.result(stack.submit({"no": "text"}))
    assert (bad["state"], bad["reason"]) == ("failed", "invalid_request")
    assert "payload.text must be a string" in bad["error"]


def test_a_503_with_retry_after_is_retried_no_sooner(stack: Stack) -> None:
    task_id = stack.submit({"text": "a b", "mode": "busy"})
    assert stack.result(task_id)["result"] == {"words": 2, "longest": "a"}
    events = stack.events(task_id)
    retry = next(e for e in events if e["type"] == "retry_scheduled")
    assert retry["data"]["delay_ms"] >= 1000 and "HTTP 503" in retry["data"]["error"]
    started = [e for e in events if e["type"] == "accepted"]
    assert [e["attempt"] for e in started] == [1, 2]
    assert started[1]["time"] - retry["time"] >= 950  # (the retry waited what Retry-After said)


def test_the_agent_gets_the_reach_headers_and_the_users_header(stack: Stack) -> None:
    task_id = stack.submit({"text": "x", "mode": "headers"}, timeout_s=60)
    seen = stack.result(task_id)["result"]
    assert seen["x-reach-task-id"] == task_id and seen["x-reach-attempt"] == "1"
    deadline = datetime.fromisoformat(seen["x-reach-deadline"].replace("Z", "+00:00"))
    assert 0 < deadline.timestamp() - time.time() <= 60
    assert seen["authorization"] == f"Bearer {SECRET}"  # (${AGENT_TOKEN} expanded)
    assert seen["x-reach-callback-url"] == f"{stack.gateway}/v1/callbacks/{task_id}"
    assert seen["x-reach-callback-token"].startswith("1.")
    assert SECRET not in stack.words.output()  # (header values are never logged)


def test_progress_lines_become_progress_events(stack: Stack) -> None:
    task_id = stack.submit({"text": "one two", "mode": "progress", "steps": 3})
    assert stack.result(task_id)["result"] == {"words": 2, "longest": "one"}
    progress = [e["data"] for e in stack.events(task_id) if e["type"] == "progress"]
    assert progress == [{"fraction": (i + 1) / 4, "message": f"step {i + 1} of 3"} for i in range(3)]


def test_an_accepted_task_ends_by_the_agents_callback(stack: Stack) -> None:
    task_id = stack.submit({"text": "called back later", "mode": "accept", "work_ms": 200})
    assert stack.result(task_id)["result"] == {"words": 3, "longest": "called"}
    (entry,) = stack.accepted(task_id)
    assert entry["callback_url"] == f"{stack.gateway}/v1/callbacks/{task_id}"
    events = stack.events(task_id)
    # (no poll of the status URL happened: polling a running job reports its "working" progress)
    assert not [e for e in events if e["type"] == "progress"]


def test_a_stale_attempts_callback_is_refused(stack: Stack) -> None:
    # The agent never finishes: attempt 1 times out, attempt 2 starts; attempt 1's token is stale.
    task_id = stack.submit({"text": "late", "mode": "accept", "callback": "never", "work_ms": 600_000},
                           timeout_s=1, max_attempts=3)
    first = wait_until(lambda: [e for e in stack.accepted(task_id) if e["attempt"] == 1], 20)[0]
    second = wait_until(lambda: [e for e in stack.accepted(task_id) if e["attempt"] == 2], 20)[0]
    url = f"/v1/callbacks/{task_id}"
    outcome = {"status": "success", "result": {"from": "callback"}}
    stale = stack.http.post(url, json=outcome, headers={"X-Reach-Callback-Token": first["token"]})
    assert stale.status_code == 409 and stale.json()["error"]["code"] == "stale"
    forged = stack.http.post(url, json=outcome, headers={"X-Reach-Callback-Token": "2." + "x" * 32})
    assert forged.status_code == 401
    assert stack.http.post(url, json=outcome).status_code == 401
    bad = stack.http.post(url, json={"status": "done"}, headers={"X-Reach-Callback-Token": second["token"]})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "status"
    taken = stack.http.post(url, json=outcome, headers={"X-Reach-Callback-Token": second["token"]})
    assert taken.status_code == 200 and taken.json() == {"accepted": True, "duplicate": False}
    done = stack.result(task_id)
    assert done["result"] == {"from": "callback"}
    assert stack.http.get(f"/v1/tasks/{task_id}").json()["attempt"] == 2


def test_an_accepted_task_is_polled_when_no_callback_comes(stack: Stack) -> None:
    # `words` has a callback URL: it polls once poll_after (1.5 s) passes with no callback.
    task_id = stack.submit({"text": "never called back", "mode": "accept", "callback": "never"})
    assert stack.result(task_id)["result"] == {"words": 3, "longest": "called"}
    # `wordspoll` has none: it polls the status URL at once, backing off while the job runs.
    task_id = stack.submit({"text": "polled for it", "mode": "poll", "work_ms": 500}, capability="wordspoll")
    assert stack.result(task_id)["result"] == {"words": 3, "longest": "polled"}
    progress = [e["data"] for e in stack.events(task_id) if e["type"] == "progress"]
    assert progress and progress[0] == {"fraction": 0.1, "message": "working"}  # (a 202 of status_url)


def test_the_readiness_probe_makes_the_agent_not_ready_and_back(stack: Stack) -> None:
    assert stack.words.agent_id is not None
    httpx.post(f"{stack.agent}/admin/ready", json={"ready": False}, timeout=5)
    try:
        wait_until(lambda: agent_state_of(stack.settings, stack.words.agent_id) is AgentState.NOT_READY,
                   10, message="the agent not_ready while /ready answers 503")
        task_id = stack.submit({"text": "waits for a ready agent"})
        time.sleep(1.0)  # (five heartbeats: nothing may take it meanwhile)
        status = stack.http.get(f"/v1/tasks/{task_id}").json()
        assert status["attempt"] == 0 and status["state"] in ("queued", "dispatched")
    finally:
        httpx.post(f"{stack.agent}/admin/ready", json={"ready": True}, timeout=5)
    wait_until(lambda: agent_state_of(stack.settings, stack.words.agent_id) is AgentState.HEALTHY,
               10, message="the agent healthy again")
    assert stack.result(task_id)["result"] == {"words": 5, "longest": "waits"}


def test_an_agent_that_refuses_connections_takes_no_tasks(fleet: Fleet, settings: Settings) -> None:
    with socket.socket() as sock:  # (a port nothing listens on yet)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    fleet.dispatcher()
    worker = fleet.worker("wordsdown", wait=False, extra_args=["--http", f"http://127.0.0.1:{port}/process"])
    assert worker.agent_id is not None
    wait_until(lambda: agent_state_of(settings, worker.agent_id) is AgentState.NOT_READY, 20,
               message="the agent not_ready while its URL refuses connections")
    _, gateway = start_gateway(fleet)
    with httpx.Client(base_url=gateway, timeout=30) as http:
        task_id = http.post("/v1/tasks", json={"capability": "wordsdown", "payload": {"text": "a b c"}}
                            ).json()["task_id"]
        time.sleep(1.0)  # (five heartbeats: nothing may take it meanwhile)
        assert http.get(f"/v1/tasks/{task_id}").json()["attempt"] == 0
        start_node_agent(fleet, port)
        wait_until(lambda: agent_state_of(settings, worker.agent_id) is AgentState.HEALTHY, 20,
                   message="the agent healthy once its URL answers")
        reply = http.get(f"/v1/tasks/{task_id}/result", params={"wait": 30}).json()
        assert reply["result"] == {"words": 3, "longest": "a"}
