"""The console in a real headless Chromium (Debian's, driven by Playwright), against a real
stack: log in, watch queues and agents live, find tasks, follow a timeline, replay a dead
letter by clicking, and the read-only view of a reader key. Each page visited is saved as a
screenshot under tests/artifacts/ (git-ignored): look at them after a change to the console."""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from broker.models import TaskState
from gateway.apikeys import Role
from tests.conftest import sync_redis, wait_until
from tests.console_helpers import CAP, ConsoleStack, console_stack, launch_chromium, screenshot

pytestmark = pytest.mark.one_redis

LIVE_TIMEOUT_MS = 15_000


@pytest.fixture(scope="module")
def stack(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleStack]:
    with console_stack(redis_url, tmp_path_factory.mktemp("console")) as s:
        yield s


@pytest.fixture(scope="module")
def browser(stack: ConsoleStack) -> Iterator[Any]:
    playwright, chromium = launch_chromium()
    yield chromium
    chromium.close()
    playwright.stop()


def _page(browser: Any, stack: ConsoleStack, role: Role | None = Role.OPERATOR) -> Any:
    """A fresh browser context (its own cookies), logged in with a key of `role`."""
    context = browser.new_context(viewport={"width": 1366, "height": 860}, base_url=stack.url)
    page = context.new_page()
    page.set_default_timeout(LIVE_TIMEOUT_MS)
    if role is not None:
        page.goto("/console")
        page.fill("input[name=key]", stack.keys[role])
        page.click("button[type=submit]")
        page.wait_for_url(re.compile(r".*/console$"))
    return page


def test_log_in_and_see_queues_and_agents(browser: Any, stack: ConsoleStack) -> None:
    page = _page(browser, stack, None)
    page.goto("/console/agents")
    assert "/console/login" in page.url  # (no session: the login form, then back)
    page.fill("input[name=key]", "rk_not-a-key")
    page.click("button[type=submit]")
    assert "Unknown or revoked API key" in page.inner_text("main")
    screenshot(page, "login")
    page.fill("input[name=key]", stack.keys[Role.OPERATOR])
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r".*/console/agents$"))
    page.wait_for_selector("tr[data-agent=web-a][data-state=healthy]")
    screenshot(page, "agents")
    stack.client.submit(CAP, {"sleep": 0.2})
    page.goto("/console")
    row = page.locator("#overview-table tr", has_text=CAP).first
    row.wait_for()
    assert "1 / 1" in row.inner_text()
    page.wait_for_selector("#feed li.ev")  # (the live activity feed)
    screenshot(page, "overview")
    page.context.close()


def test_an_agent_going_offline_shows_without_a_reload(browser: Any, stack: ConsoleStack) -> None:
    page = _page(browser, stack)
    page.goto("/console/agents")
    page.wait_for_selector("tr[data-agent=web-frozen][data-state=healthy]")
    page.evaluate("window.__notReloaded = true")
    stack.frozen.signal(signal.SIGSTOP)
    try:
        page.wait_for_selector("tr[data-agent=web-frozen][data-state=suspect]")
        page.wait_for_selector("tr[data-agent=web-frozen][data-state=offline]")
        assert page.evaluate("window.__notReloaded") is True
        screenshot(page, "agents-offline")
    finally:
        stack.frozen.signal(signal.SIGCONT)
    page.wait_for_selector("tr[data-agent=web-frozen][data-state=healthy]")
    page.context.close()


def test_find_a_task_by_id_and_by_state_and_read_its_timeline(browser: Any, stack: ConsoleStack) -> None:
    hostile = "<script>window.__xss = 1</script><img src=x onerror='window.__xss = 2'>"
    good = stack.client.submit(CAP, {"steps": 2, "note": hostile},
                               trace_id="7ace0000000000000000000000000eb0").task_id
    bad = stack.client.submit(CAP, {"invalid": hostile}).task_id
    for task_id in (good, bad):
        wait_until(lambda t=task_id: stack.client.status(t).state.terminal, message=f"{task_id} ends")
    page = _page(browser, stack)
    page.goto("/console/tasks")
    page.fill("input[name=id]", good)
    page.click("form.find button")
    page.wait_for_url(re.compile(f".*/console/tasks/{re.escape(good)}$"))
    timeline = page.inner_text("#timeline")
    for event in ("queued", "dispatched", "accepted", "progress", "succeeded"):
        assert event in timeline
    assert hostile in page.inner_text("main")  # (shown as text: escaped, never run)
    assert page.evaluate("window.__xss") is None
    assert page.locator("main script, main img[src=x]").count() == 0
    screenshot(page, "task")
    page.goto("/console/tasks")
    page.select_option("select[name=state]", "failed")
    page.click("form.filters button[type=submit]")
    page.wait_for_url(re.compile(r".*state=failed.*"))
    rows = page.locator("#tasks-table tbody tr")
    assert rows.count() == 1 and bad in rows.first.inner_text()
    screenshot(page, "tasks-failed")
    rows.first.locator("a").click()
    assert "invalid_request" in page.inner_text("main")
    assert page.evaluate("window.__xss") is None
    page.context.close()


def test_replay_a_dead_letter_by_clicking_and_confirming(browser: Any, stack: ConsoleStack) -> None:
    flag = f"{stack.settings.prefix}:test:fail"
    r = sync_redis(stack.settings.redis_url)
    r.set(flag, "1")
    task_id = stack.client.submit(CAP, {"flag": flag}).task_id
    wait_until(lambda: stack.client.status(task_id).state is TaskState.FAILED, message="the task fails")
    page = _page(browser, stack)
    page.goto(f"/console/dlq?capability={CAP}")
    row = page.locator("#dlq-table tbody tr", has_text=task_id)
    screenshot(page, "dead-letters")
    r.delete(flag)  # (the agent succeeds from now on)
    r.close()
    row.locator("a[data-test=replay-one]").click()
    assert "Replay 1 dead letter?" in page.inner_text("h1")
    screenshot(page, "dead-letter-confirm")
    page.click("#confirm-action")
    assert "1 dead letter replayed." in page.inner_text(".flash")
    wait_until(lambda: stack.client.status(task_id).state is TaskState.SUCCEEDED,
               message="the replay succeeds")
    page.goto(f"/console/tasks/{task_id}")
    assert "replayed" in page.inner_text("#timeline")
    assert page.locator(".head .pill").inner_text() == "succeeded"
    page.context.close()


def test_a_reader_key_gets_no_action_buttons(browser: Any, stack: ConsoleStack) -> None:
    waiting = stack.client.submit("cwebnobody", {"x": 1}).task_id
    page = _page(browser, stack, Role.READER)
    assert "read-only" in page.inner_text("header")
    page.goto(f"/console/tasks/{waiting}")
    assert page.locator("form[action$='/cancel']").count() == 0
    page.goto("/console/dlq")
    assert page.locator("a[href*='/console/dlq/confirm'], input[name=ref]").count() == 0
    page.goto("/console/policy")
    assert page.locator("form[action*='/pause']").count() == 0
    screenshot(page, "policy-reader")
    # Even a well-formed POST (its session's CSRF token and all) is refused for a reader.
    token = page.locator("input[name=csrf]").first.get_attribute("value")
    reply = page.request.post(f"/console/tasks/{waiting}/cancel", form={"csrf": token},
                              max_redirects=0)
    assert reply.status == 403
    assert stack.client.status(waiting).state is TaskState.QUEUED
    page.context.close()


def test_a_post_without_the_csrf_token_is_refused(browser: Any, stack: ConsoleStack) -> None:
    waiting = stack.client.submit("cwebnobody", {"x": 2}).task_id
    page = _page(browser, stack)
    page.goto(f"/console/tasks/{waiting}")
    for form in ({}, {"csrf": "0" * 40}):
        reply = page.request.post(f"/console/tasks/{waiting}/cancel", form=form, max_redirects=0)
        assert reply.status == 403 and "CSRF" in reply.text()
    assert stack.client.status(waiting).state is TaskState.QUEUED
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("form[action$='/cancel'] button")
    page.wait_for_url(re.compile(r".*done=canceled"))
    assert stack.client.status(waiting).state is TaskState.CANCELED
    page.goto("/console/schedules")
    screenshot(page, "schedules")
    page.context.close()
