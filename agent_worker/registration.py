"""Registering an agent, and the heartbeat thread that keeps it known.

The heartbeat runs on its own thread with its own short-timeout Redis connection, apart from the
event loop that runs tasks: so a heartbeat can say "alive, but my executor is stuck" (the loop's
last progress is old) and the registry can tell liveness from readiness. A missing Redis never
stops the agent's work; beats resume when Redis is back.
"""

from __future__ import annotations

import asyncio
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
from broker import identity
from broker.errors import RegistrationRefused
from broker.infra import connection, fatal
from broker.infra.connection import AsyncRedis
from broker.keys import RegistryKeys
from broker.models import AgentDescriptor
from broker.protocol.agents import (
    bind_call,
    heartbeat_call,
    parse_heartbeat,
    parse_register,
    register_call,
    token_renew_call,
)
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


_REFUSALS = {
    Status.LIVE: "agent id {id!r} is live and held by another process (its last heartbeat was "
                 "{quiet_s:.1f}s ago; an id is free once offline, after {offline_s:.0f}s without "
                 "one); refusing to displace it: stop that process first, wait, or choose another "
                 "--agent-id",
    Status.REVOKED: "agent {id!r} was revoked by an operator (reach agents revoke); stopping",
    Status.SECRET_REQUIRED: "this fleet requires a join secret to register agent {id!r}: set "
                            "REACH_JOIN_SECRET (or join_secret in the config file)",
    Status.SECRET_WRONG: "the join secret given for agent {id!r} (REACH_JOIN_SECRET or "
                         "join_secret) is not this fleet's",
}


def refusal_message(agent_id: str, status: Status, settings: Settings | None = None,
                    quiet_ms: int | None = None) -> str:
    text = _REFUSALS.get(status, "the registry refused agent {id!r} (" + status.value + ")")
    offline_ms = settings.offline_after_ms if settings is not None else 0
    return text.format(id=agent_id, quiet_s=(quiet_ms or 0) / 1000, offline_s=offline_ms / 1000)


class JoinProof:
    """The proof of the fleet's join secret this worker presents (broker/identity.py), derived
    once per stored salt (deriving takes a moment: it runs on a thread)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._for: identity.JoinParams | None = None
        self._proof = ""

    async def get(self, client: AsyncRedis) -> str:
        """The proof for the fleet's current secret; '' when the fleet has none or this
        worker was given none (the registry then says whether it needs one)."""
        secret = self.settings.join_secret
        if secret is None:
            return ""
        fields: Any = await client.hgetall(RegistryKeys(self.settings.prefix).join_secret)
        params = identity.parse_params(fields or {})
        if params is None:
            return ""
        if params != self._for:
            self._proof = await asyncio.to_thread(identity.join_proof, secret.get_secret_value(), params)
            self._for = params
        return self._proof


async def register(settings: Settings, client: AsyncRedis, scripts: AsyncScripts,
                   descriptor: AgentDescriptor, described: str = "", *, held_token: str = "",
                   proof: JoinProof | None = None) -> str:
    """Register (idempotent upsert) and bind every capability; returns the new token.
    `described`: the capabilities' descriptions (JSON, see broker/models.py); `held_token`:
    the token this process holds for its id (it may take the id back while it is live).
    RegistrationRefused when the registry will not have it (module _REFUSALS says why)."""
    token, sha = new_token()
    join = await proof.get(client) if proof is not None else ""
    reply = parse_register(await scripts(register_call(
        settings, descriptor.agent_id, sha, descriptor.model_dump_json(),
        round(descriptor.warmup_s * 1000), descriptor.capabilities, described,
        held_token=held_token, join_proof=join, who=f"{descriptor.host or '?'} pid {descriptor.pid}",
    )))
    if reply.status is not Status.OK:
        raise RegistrationRefused(refusal_message(descriptor.agent_id, reply.status, settings, reply.ms),
                                  reply.status.value)
    for capability in descriptor.capabilities:
        await scripts(bind_call(settings, capability, descriptor.agent_id, sha,
                                ttl_ms=settings.agent_token_ttl_ms))
    return token


async def renew_token(settings: Settings, scripts: AsyncScripts, agent_id: str, capabilities: list[str],
                      token: str) -> Status:
    """Move the token's expiry on, in the registry and in each capability (bind.lua in renewal
    mode: never binds a token that is gone). ok, or why not (refused, unknown, revoked)."""
    reply = parse_heartbeat(await scripts(token_renew_call(settings, agent_id, token)))
    if reply.status is not Status.OK:
        return reply.status
    sha = token_sha(token)
    for capability in capabilities:
        bound = await scripts(bind_call(settings, capability, agent_id, sha,
                                        ttl_ms=settings.agent_token_ttl_ms, renew_only=True))
        if not int(bound):
            return Status.REFUSED  # (taken off this capability: revoked or pruned meanwhile)
    return Status.OK


class HeartbeatThread(threading.Thread):
    """Beats every heartbeat_ms (and at once when asked), carrying the worker's stats."""

    def __init__(self, settings: Settings, agent_id: str, token: Callable[[], str],
                 stats: Callable[[], dict[str, Any]], on_refused: Callable[[str, Status], None]) -> None:
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
                    self.settings, socket_timeout=HEARTBEAT_SOCKET_TIMEOUT_S,
                    client_name=RegistryKeys(self.settings.prefix).agent_client(self.agent_id))
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
            if reply.status is not Status.REVOKED:
                log.error("registry refused this agent's heartbeat (%s); registering again", reply.status)
            self._sent = {}
            self._on_refused(token, reply.status)
            return False
        self.failures = 0
        self.beats += 1
        return True
