"""A real stack for the console's tests: a dispatcher, workers and `reach serve` as processes, API
keys, and Debian's Chromium driven by Playwright (never a downloaded browser)."""

from __future__ import annotations

import os
import secrets
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from broker import ReachClient
from broker.settings import Settings
from gateway.apikeys import Role, create_key
from tests.conftest import FAST, ROOT, Fleet, Proc, _delete_prefix, sync_redis
from tests.gateway_helpers import start_gateway

CHROMIUM = os.environ.get("REACH_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
ARTIFACTS = ROOT / "tests" / "artifacts"
"""Screenshots of each page the browser tests visit (git-ignored): look at them."""
CAP = "cweb"
SPARE_CAP = "cweb2"
"""Served only by the worker the tests freeze (its tasks never matter)."""


class ConsoleStack:
    def __init__(self, settings: Settings, fleet: Fleet, url: str, keys: dict[Role, str],
                 frozen: Proc) -> None:
        self.settings = settings
        self.fleet = fleet
        self.url = url
        self.keys = keys
        self.frozen = frozen
        self.client = ReachClient(settings)
        self.http = httpx.Client(base_url=url, timeout=30)

    def login(self, role: Role) -> httpx.Client:
        """An HTTP client logged in to the console with a key of `role`."""
        return self.login_with(self.keys[role])

    def login_with(self, key: str) -> httpx.Client:
        http = httpx.Client(base_url=self.url, timeout=30, follow_redirects=False)
        form = http.get("/console/login")
        token = csrf_of(form.text)
        reply = http.post("/console/login", data={"key": key, "csrf": token, "next": "/console"})
        assert reply.status_code == 303, reply.text
        return http

    def close(self) -> None:
        self.http.close()
        self.client.close()


def csrf_of(html: str) -> str:
    marker = 'name="csrf" value="'
    start = html.index(marker) + len(marker)
    return html[start:html.index('"', start)]


@contextmanager
def console_stack(redis_url: str, tmp: Path, *, keys: bool = True) -> Iterator[ConsoleStack]:
    prefix = f"t{secrets.token_hex(4)}"
    settings = Settings.load(redis_url=redis_url, prefix=prefix, **FAST)
    fleet = Fleet(settings, tmp)
    made: dict[Role, str] = {}
    stack = None
    try:
        fleet.dispatcher()
        fleet.worker(CAP, handler="tests.gateway_handlers:work", concurrency=4, agent_id="web-a")
        frozen = fleet.worker(SPARE_CAP, handler="tests.gateway_handlers:work", concurrency=2,
                              agent_id="web-frozen")
        if keys:
            r = sync_redis(redis_url)
            for role in (Role.OPERATOR, Role.READER):
                made[role], _ = create_key(r, settings, role, f"console {role.value}")
            r.close()
        _, url = start_gateway(fleet, settings)
        stack = ConsoleStack(settings, fleet, url, made, frozen)
        yield stack
    except BaseException:
        for proc in fleet.procs:
            sys.stderr.write(f"\n----- {proc.name} -----\n{proc.output()[-3000:]}\n")
        raise
    finally:
        if stack is not None:
            stack.close()
        fleet.stop_all()
        _delete_prefix(redis_url, prefix)


def launch_chromium() -> Any:
    """(playwright, browser); skips when Debian's chromium or Playwright is missing."""
    if not Path(CHROMIUM).exists() or shutil.which(CHROMIUM) is None:
        if os.environ.get("CI"):  # (.ci/run installs it: a skip there would hide the console)
            pytest.fail(f"no Chromium at {CHROMIUM}")
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    playwright = sync_api.sync_playwright().start()
    browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    return playwright, browser


def screenshot(page: Any, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
