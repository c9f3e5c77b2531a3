"""Whether the HTTP agents behind a worker can take tasks now: probed on the heartbeat cadence,
apart from task calls (its own small client, a 2 s timeout).

With `--http-ready URL` (or `auto`: `<origin>/ready`) the probe is a GET that must answer 2xx;
without it, the agent must at least accept a connection. While a probe fails the worker starts
nothing new, hands its unread tasks back, and its heartbeat says it is not ready (the registry's
`not_ready`: dispatchers send it nothing); when the probe answers again it carries on. A task
call that cannot connect probes at once, so an agent that went away stops taking tasks at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from agent_worker.http_bridge.options import PROBE_TIMEOUT_S, ready_url

log = logging.getLogger("reach.worker")


@dataclass(frozen=True, slots=True)
class Probe:
    """One thing to check: a GET of `url` (2xx), or a connection to `host`:`port`."""

    url: str | None = None
    host: str = ""
    port: int = 0

    @classmethod
    def for_agent(cls, agent_url: str, ready: str | None) -> Probe:
        if ready is not None:
            return cls(url=ready_url(ready, agent_url))
        parts = urlsplit(agent_url)
        return cls(host=parts.hostname or "", port=parts.port or (443 if parts.scheme == "https" else 80))

    def __str__(self) -> str:
        return f"GET {self.url}" if self.url else f"connect {self.host}:{self.port}"

    async def check(self, client: httpx.AsyncClient) -> str | None:
        """None when it passes, else why not."""
        try:
            if self.url is not None:
                response = await client.get(self.url)
                if 200 <= response.status_code < 300:
                    return None
                return f"readiness probe {self} answered {response.status_code}"
            _, writer = await asyncio.wait_for(asyncio.open_connection(self.host, self.port),
                                               PROBE_TIMEOUT_S)
            writer.close()
            return None
        except (httpx.HTTPError, OSError, TimeoutError) as exc:
            return f"readiness probe {self} failed: {type(exc).__name__}: {exc}".rstrip(": ")


class Readiness:
    """The probes' verdict, and what changes when it does (told through `on_change`)."""

    def __init__(self, probes: list[Probe], interval_s: float,
                 on_change: Callable[[bool], None], while_unready: Callable[[], Awaitable[None]]) -> None:
        self.probes = list(dict.fromkeys(probes))
        self.interval_s = interval_s
        self.ready = False
        """False until the first probe passed (a worker whose agent is down takes nothing)."""
        self.reason = "not probed yet"
        self._on_change = on_change
        self._while_unready = while_unready
        self._wake = asyncio.Event()

    def check_soon(self) -> None:
        """Probe now (a task call could not connect)."""
        self._wake.set()

    async def run(self) -> None:
        async with httpx.AsyncClient(timeout=PROBE_TIMEOUT_S) as client:
            while True:
                await self.probe_once(client)
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.interval_s)

    async def probe_once(self, client: httpx.AsyncClient) -> None:
        failures = [why for why in await asyncio.gather(*(p.check(client) for p in self.probes)) if why]
        ready = not failures
        first = self.reason == "not probed yet"
        if ready != self.ready or (first and not ready):
            self.ready = ready
            self.reason = "" if ready else failures[0]
            if ready:
                log.info("HTTP agent ready (%s)", ", ".join(str(p) for p in self.probes))
            else:
                log.warning("HTTP agent not ready: %s; taking no tasks until it is", self.reason)
            self._on_change(ready)
        elif failures:
            self.reason = failures[0]
        if not ready:
            await self._while_unready()
