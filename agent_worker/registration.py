"""Registering an agent, and the heartbeat thread that keeps it known.

The heartbeat runs on its own thread with its own short-timeout Redis connection, apart from the
event loop that runs tasks: so a heartbeat can say "alive, but my executor is stuck" (the loop's
last progress is old) and the registry can tell liveness from readiness. A missing Redis never
stops the agent's work; beats resume when Redis is back.
"""

from __future__ import annotations

import contextvars
import hashlib
import logging
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from agent_worker.stats import FULL_STATS_EVERY_S, changed
from broker.infra import connection, fatal
from broker.infra.connection import AsyncRedis
from broker.models import AgentDescriptor
from broker.protocol.agents import bind_call, heartbeat_call, parse_heartbeat, register_call
from broker.protocol.calls import Status
from broker.scripts import AsyncScripts, Scripts
from broker.settings import Settings

log = logging.getLogger("reach.worker")

HEARTBEAT_SOCKET_TIMEOUT_S = 2.0


def token_sha(token: str) -> str:
    """What the registry stores instead of the token (scripts compare with redis.sha1hex)."""
    return hashlib.sha1(token.encode()).hexdigest()


def new_token() -> tuple[str, str]:
    """(token, its sha1 hex). Only the hash is ever stored."""
    token = secrets.token_urlsafe(24)
    return token, token_sha(token)


async def register(settings: Settings, client: AsyncRedis, scripts: AsyncScripts,
                   descriptor: AgentDescriptor, described: str = "") -> str:
    """Register (idempotent upsert) and bind every capability; returns the new token.
    `described`: the capabilities' descriptions (JSON, see broker/models.py)."""
    token, sha = new_token()
    await scripts(register_call(
        settings, descriptor.agent_id, sha, descriptor.model_dump_json(),
        round(descriptor.warmup_s * 1000), descriptor.capabilities, described,
    ))
    for capability in descriptor.capabilities:
        await scripts(bind_call(settings, capability, descriptor.agent_id, sha))
    return token


class HeartbeatThread(threading.Thread):
    """Beats every heartbeat_ms (and at once when asked), carrying the worker's stats."""

    def __init__(self, settings: Settings, agent_id: str, token: Callable[[], str],
                 stats: Callable[[], dict[str, Any]], on_refused: Callable[[str], None]) -> None:
        super().__init__(name="reach-heartbeat", daemon=True)
        self.settings = settings
        self.agent_id = agent_id
        self._token = token
        self._stats = stats
        self._on_refused = on_refused
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._mode = ""
        self._client: Any = None
        self._scripts: Scripts | None = None
        self.beats = 0
        self.failures = 0
        self._sent: dict[str, Any] = {}
        self._sent_at = 0.0
        self.clock_offset_ms: float | None = None
        """Redis server clock minus this host's clock (time.time), from the last beat."""

    def beat_now(self, mode: str = "") -> None:
        if mode:
            self._mode = mode
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def start(self) -> None:
        # (Its beats run in the context of the one who started it: the worker's fatal guard.)
        self._context = contextvars.copy_context()
        super().start()

    def run(self) -> None:
        self._context.run(self._run)

    def _run(self) -> None:
        interval = self.settings.heartbeat_ms / 1000
        while not self._stop.is_set():
            try:
                self.beat()
            except Exception:  # the heartbeat must outlive any bug: a dead beat looks like a dead agent
                log.exception("heartbeat failed unexpectedly; beating on")
            self._wake.wait(interval)
            self._wake.clear()
        if self._client is not None:
            self._client.close()

    def beat(self) -> bool:
        try:
            if self._client is None:
                self._client = connection.sync_client(
                    self.settings, socket_timeout=HEARTBEAT_SOCKET_TIMEOUT_S
                )
                self._scripts = Scripts(self._client)
            assert self._scripts is not None
            stats = self._stats()
            # Every beat carries the numbers, but only one where they moved (or every
            # FULL_STATS_EVERY_S) makes dispatchers re-read the record: a large fleet does not
            # storm the registry's readers.
            fresh = changed(self._sent, stats) or time.monotonic() - self._sent_at >= FULL_STATS_EVERY_S
            sent_at = time.time()
            token = self._token()
            reply = parse_heartbeat(self._scripts(heartbeat_call(
                self.settings, self.agent_id, token, stats, self._mode, significant=fresh
            )))
            if reply.status is Status.OK and reply.server_ms is not None:
                self.clock_offset_ms = reply.server_ms - (sent_at + time.time()) * 500
            if fresh and reply.status is Status.OK:
                self._sent, self._sent_at = stats, time.monotonic()
        except (redis.exceptions.RedisError, OSError) as exc:
            if fatal.stops(exc):
                self._stop.set()
                return False
            self.failures += 1
            if self.failures == 1 or self.failures % 10 == 0:
                log.warning("heartbeat failed (%s); the agent keeps working", exc)
            return False
        if reply.status is not Status.OK:
            if token != self._token():  # (registered again while it was on its way: beat anew)
                self._wake.set()
                return False
            log.error("registry refused this agent's heartbeat (%s); registering again", reply.status)
            self._sent = {}
            self._on_refused(token)
            return False
        self.failures = 0
        self.beats += 1
        return True
