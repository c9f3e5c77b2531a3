"""The console over plain HTTP against a real stack: sessions and their cookie, CSRF, roles,
escaping, hidden payloads, the live stream, and errors as pages."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import httpx
import pytest

from broker.models import TaskState
from broker.settings import Settings
from gateway.apikeys import Role, create_key, revoke_key
from tests.conftest import FAST, sync_redis, wait_until
from tests.console_helpers import CAP, ConsoleStack, console_stack, csrf_of
from tests.gateway_helpers import start_gateway

pytestmark = pytest.mark.one_redis

HOSTILE = "<script>alert('x')</script>"


@pytest.fixture(scope="module")
def stack(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleStack]:
    with console_stack(redis_url, tmp_path_factory.mktemp("console-http")) as s:
        yield s


def test_pages_need_a_login_and_the_cookie_is_httponly_and_strict(stack: ConsoleStack) -> None:
    reply = stack.http.get("/console/tasks", follow_redirects=False)
    assert reply.status_code == 303 and reply.headers["location"] == "/console/login?next=%2Fconsole%2Ftasks"
    http = stack.login(Role.OPERATOR)
    login = http.get("/console/login")
    cookie = [v for k, v in login.headers.multi_items() if k == "set-cookie"]
    assert cookie == []  # (logged in: no new session handed out)
    form = httpx.get(f"{stack.url}/console/login")
    set_cookie = form.headers["set-cookie"]
    assert "HttpOnly" in set_cookie and "SameSite=strict" in set_cookie and "Path=/console" in set_cookie
    page = http.get("/console/agents")
    assert page.status_code == 200 and "web-a" in page.text
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    assert page.headers["x-content-type-options"] == "nosniff"
    assert "rk_" not in page.text  # (the key is never shown back)
    http.close()


def test_a_wrong_key_and_a_forged_cookie_get_nothing(stack: ConsoleStack) -> None:
    http = httpx.Client(base_url=stack.url, timeout=30)
    token = csrf_of(http.get("/console/login").text)
    reply = http.post("/console/login", data={"key": "rk_wrong", "csrf": token, "next": "/console"})
    assert reply.status_code == 401 and "Unknown or revoked API key" in reply.text
    forged = httpx.Client(base_url=stack.url, timeout=30,
                          cookies={"reach_console": "abcd1234.n0nce.9999999999.00"})
    assert forged.get("/console/agents", follow_redirects=False).status_code == 303
    http.close()
    forged.close()


def test_login_itself_needs_the_csrf_token(stack: ConsoleStack) -> None:
    http = httpx.Client(base_url=stack.url, timeout=30)
    http.get("/console/login")
    reply = http.post("/console/login", data={"key": stack.keys[Role.OPERATOR], "next": "/console"})
    assert reply.status_code == 403 and "CSRF" in reply.text
    assert "reach_console" not in reply.headers.get("set-cookie", "")
    http.close()


def test_a_revoked_key_ends_its_sessions(stack: ConsoleStack, redis_url: str) -> None:
    r = sync_redis(redis_url)
    key, record = create_key(r, stack.settings, Role.READER, "short-lived")
    http = stack.login_with(key)
    assert http.get("/console/agents").status_code == 200
    revoke_key(r, stack.settings, record.id)
    r.close()
    wait_until(lambda: http.get("/console/agents", follow_redirects=False).status_code == 303, 5,
               message="the session ended")
    http.close()


def test_task_data_is_escaped_and_truncated(stack: ConsoleStack) -> None:
    big = {"note": HOSTILE, "filler": "y" * 10_000}
    task_id = stack.client.submit(CAP, big).task_id
    wait_until(lambda: stack.client.status(task_id).state is TaskState.SUCCEEDED, message="the task")
    http = stack.login(Role.READER)
    page = http.get(f"/console/tasks/{task_id}").text
    assert HOSTILE not in page
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in page
    assert "more characters not shown" in page
    feed = http.get("/console/tasks", params={"capability": CAP}).text
    assert task_id in feed
    http.close()


def test_payloads_can_be_hidden(stack: ConsoleStack) -> None:
    task_id = stack.client.submit(CAP, {"secret": "card 4111"}).task_id
    wait_until(lambda: stack.client.status(task_id).state is TaskState.SUCCEEDED, message="the task")
    hidden = Settings.load(redis_url=stack.settings.redis_url, prefix=stack.settings.prefix,
                           console_show_payloads=False, **FAST)
    _, url = start_gateway(stack.fleet, hidden)
    http = httpx.Client(base_url=url, timeout=30)
    token = csrf_of(http.get("/console/login").text)
    http.post("/console/login", data={"key": stack.keys[Role.OPERATOR], "csrf": token, "next": "/console"})
    page = http.get(f"/console/tasks/{task_id}").text
    assert "card 4111" not in page and "console_show_payloads = false" in page
    assert "card 4111" in stack.login(Role.READER).get(f"/console/tasks/{task_id}").text
    http.close()


def test_the_live_stream_sends_the_agents_and_the_feed(stack: ConsoleStack) -> None:
    http = stack.login(Role.READER)
    task_id = stack.client.submit(CAP, {"x": "live"}).task_id
    seen: dict[str, str] = {}
    deadline = time.monotonic() + 20
    with http.stream("GET", "/console/live") as reply:
        assert reply.headers["content-type"].startswith("text/event-stream")
        event = ""
        for line in reply.iter_lines():
            if line.startswith("event:"):
                event = line.split(":", 1)[1].strip()
            elif line.startswith("data:") and event:
                seen[event] = seen.get(event, "") + line
            if ("web-a" in seen.get("agents", "") and task_id in seen.get("feed", "")) \
                    or time.monotonic() > deadline:
                break
    assert "web-a" in seen.get("agents", "") and "healthy" in seen["agents"]
    assert task_id in seen.get("feed", "") and CAP in seen.get("overview", "")
    http.close()


def test_errors_are_pages(stack: ConsoleStack) -> None:
    http = stack.login(Role.READER)
    missing = http.get(f"/console/tasks/{CAP}:01J00000000000000000000000")
    assert missing.status_code == 404 and "text/html" in missing.headers["content-type"]
    assert http.get("/console/tasks/not-a-task-id").status_code == 400
    assert http.get("/console/tasks", params={"state": "sleeping"}).status_code == 400
    assert http.get("/console/tasks", params={"cursor": "bogus"}).status_code == 400
    token = csrf_of(http.get("/console/agents").text)
    too_big = http.post("/console/logout", content=b"csrf=" + b"x" * 300_000,
                        headers={"content-type": "application/x-www-form-urlencoded"})
    assert too_big.status_code == 413
    assert http.post("/console/logout", json={"csrf": token}).status_code == 415
    http.close()


def test_bulk_replay_and_purge_say_how_many_first(stack: ConsoleStack, redis_url: str) -> None:
    flag = f"{stack.settings.prefix}:test:bulk"
    r = sync_redis(redis_url)
    r.set(flag, "1")
    cap = "cwebbulk"
    stack.fleet.worker(cap, handler="tests.gateway_handlers:work", agent_id="web-bulk")
    ids = [stack.client.submit(cap, {"flag": flag, "i": i}).task_id for i in range(3)]
    for task_id in ids:
        wait_until(lambda t=task_id: stack.client.status(t).state is TaskState.FAILED, message="failures")
    http = stack.login(Role.OPERATOR)
    purge = http.get("/console/dlq/confirm", params={"action": "purge", "capability": cap})
    assert "Purge 3 dead letters?" in purge.text and "cannot be replayed" in purge.text
    confirm = http.get("/console/dlq/confirm", params={"action": "replay", "capability": cap})
    assert "Replay 3 dead letters?" in confirm.text
    r.delete(flag)
    # A dead letter that arrives after the confirmation is not swept in by it.
    r.set(flag, "1")
    late = stack.client.submit(cap, {"flag": flag, "i": 9}).task_id
    wait_until(lambda: stack.client.status(late).state is TaskState.FAILED, message="the late failure")
    r.delete(flag)
    fields = [("csrf", csrf_of(confirm.text))]
    fields += [(name, value) for name, value in _hidden_fields(confirm.text) if name != "csrf"]
    done = http.post("/console/dlq/replay", data=dict(fields), follow_redirects=False)
    assert done.status_code == 303 and "n=3" in done.headers["location"]
    for task_id in ids:
        wait_until(lambda t=task_id: stack.client.status(t).state is TaskState.SUCCEEDED, message="replays")
    assert stack.client.status(late).state is TaskState.FAILED
    r.close()
    http.close()


def _hidden_fields(html: str) -> list[tuple[str, str]]:
    return re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', html)


def test_an_operator_pauses_and_resumes_a_capability(stack: ConsoleStack) -> None:
    http = stack.login(Role.OPERATOR)
    token = csrf_of(http.get("/console/policy").text)
    done = http.post("/console/policy/cwebpause/pause", data={"csrf": token, "reason": "<b>maintenance</b>"})
    assert done.status_code == 303 and done.headers["location"] == "/console/policy?done=paused"
    policy = stack.client.policy("cwebpause")
    assert policy["paused"] is True and policy["paused_reason"] == "<b>maintenance</b>"
    assert http.post("/console/policy/cwebpause/resume", data={"csrf": token}).status_code == 303
    assert stack.client.policy("cwebpause")["paused"] is False
    assert http.post("/console/policy/Not Valid/pause", data={"csrf": token}).status_code in (400, 404)
    http.close()
