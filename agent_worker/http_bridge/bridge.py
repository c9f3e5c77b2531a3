"""What the HTTP agents of one worker share: one pooled httpx client (keep-alive connections,
sized to the worker's concurrency, so `--concurrency 16` runs 16 calls at once), the readiness
of the agents, and the callbacks on their way (a worker's control channel says when one came).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from agent_worker.attempt import Running
from agent_worker.http_bridge.options import CONNECT_TIMEOUT_S, BridgeOptions
from agent_worker.http_bridge.readiness import Probe, Readiness
from agent_worker.slots import Slots
from broker.infra import outages
from broker.infra.connection import AsyncRedis
from broker.protocol import callbacks
from broker.protocol.calls import Status
from broker.scripts import AsyncScripts
from broker.settings import Settings

log = logging.getLogger("reach.worker")


@dataclass(frozen=True)
class WorkerLink:
    """The parts of its worker the bridge uses."""

    settings: Settings
    redis: AsyncRedis
    scripts: AsyncScripts
    agent_id: str
    running: Running
    slots: Slots
    beat_now: Callable[[], None]
    """Heartbeat at once (the agent's readiness changed)."""
    release_unread: Callable[[], Awaitable[int]]
    """Hand the tasks still unread in this agent's inboxes back to the queue."""


class ReadinessGate:
    """What an HTTP or A2A bridge does as its agent's readiness changes: pause the worker's slots
    while it is not ready (handing back what its inboxes hold unread), resume them once it is,
    and say so in the heartbeat."""

    KIND = "HTTP"
    link: WorkerLink
    readiness: Readiness

    @property
    def ready(self) -> bool:
        return self.readiness.ready

    def _ready_changed(self, ready: bool) -> None:
        if ready:
            self.link.slots.resume()
        else:
            self.link.slots.pause()
        self.link.beat_now()

    async def _hand_back(self) -> None:
        with contextlib.suppress(*outages.TRANSIENT_ERRORS):
            released = await self.link.release_unread()
            if released:
                log.info("handed %d unread task(s) back: the %s agent is not ready", released, self.KIND)

    def heartbeat_stats(self) -> dict[str, Any]:
        return {} if self.ready else {"stalled": True, "not_ready_reason": self.readiness.reason[:300]}


class BridgedAgent(Protocol):
    """What the bridge needs of an HTTP agent (agent.py's HttpAgent)."""

    url: str
    options: BridgeOptions

    def attach(self, bridge: HttpBridge) -> None: ...


class HttpBridge(ReadinessGate):
    def __init__(self, link: WorkerLink, agents: Sequence[BridgedAgent]) -> None:
        self.link = link
        concurrency = link.slots.concurrency
        self.client = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency,
                                keepalive_expiry=30.0),
            timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT_S), follow_redirects=False)
        self._waiters: dict[str, asyncio.Event] = {}
        probes = [Probe.for_agent(a.url, a.options.ready) for a in agents]
        self.readiness = Readiness(probes, link.settings.heartbeat_ms / 1000, self._ready_changed,
                                   self._hand_back)
        link.slots.pause()  # (until the first probe passes)
        for agent in agents:
            agent.attach(self)


    # -- callbacks --------------------------------------------------------------------------

    async def arm_callback(self, task_id: str, fence: str, ttl_ms: int) -> str | None:
        """A callback token for this attempt, recorded for the gateway; None when the attempt
        is not the task's current one any more."""
        token, sha = callbacks.new_token(fence)
        link = self.link
        status = callbacks.parse_status(await link.scripts(
            callbacks.arm_call(link.settings, task_id, fence, link.agent_id, sha, ttl_ms)))
        return token if status is Status.OK else None

    async def callback_outcome(self, task_id: str, fence: str) -> str | None:
        """The outcome the gateway took for this attempt, if one came (JSON text)."""
        value: Any = await self.link.redis.hget(callbacks.callback_key(self.link.settings, task_id),
                                                callbacks.outcome_field(fence))
        return str(value) if value is not None else None

    def waiter(self, task_id: str) -> asyncio.Event:
        return self._waiters.setdefault(task_id, asyncio.Event())

    def forget(self, task_id: str) -> None:
        self._waiters.pop(task_id, None)

    def on_control(self, verb: str, task_id: str) -> None:
        """A message of the worker's control channel that is not a cancel."""
        if verb == callbacks.CONTROL_VERB and (event := self._waiters.get(task_id)) is not None:
            event.set()

    # -- lifecycle --------------------------------------------------------------------------

    def jobs(self) -> dict[str, Callable[[], Awaitable[None]]]:
        """Long-lived jobs for the worker to run beside its readers."""
        return {"http-readiness": self.readiness.run}

    async def aclose(self) -> None:
        await self.client.aclose()
