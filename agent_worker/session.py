"""This process as the registry knows it: its agent id and token, registering (again when the
registry refuses the token), binding its inboxes, and leaving for good after a drain.

A token is refused when the record it belongs to was replaced (another process registered the
same agent id once this one was offline), pruned (the agent was offline too long, e.g.
partitioned away) or expired (not renewed within agent_token_ttl_ms): the worker registers
again, presenting the token it held, once however many calls carried the refused token. A
token expires agent_token_ttl_ms after it was issued or renewed; the session renews it every
third of that. When the registry will not have this process at all (its id is live and held by
another process, the operator revoked it, the join secret is missing or wrong) the session is
cut off: it tells the worker (on_fatal), which stops with exit code 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from agent_worker.registration import (
    HeartbeatThread,
    JoinProof,
    refusal_message,
    register,
    renew_token,
    token_sha,
)
from broker.errors import RegistrationRefused
from broker.infra import outages
from broker.infra.connection import AsyncRedis
from broker.models import AgentDescriptor
from broker.protocol.agents import bind_call, deregister_call, unbind_call
from broker.protocol.calls import Status
from broker.scripts import AsyncScripts
from broker.settings import Settings

log = logging.getLogger("reach.worker")


class AgentSession:
    def __init__(self, settings: Settings, descriptor: AgentDescriptor, redis: AsyncRedis,
                 scripts: AsyncScripts, stats: Callable[[], dict[str, Any]], described: str = "",
                 on_fatal: Callable[[str], None] | None = None) -> None:
        self.settings = settings
        self.descriptor = descriptor
        self.described = described
        """Its capabilities' descriptions, registered with it (JSON; '' for none)."""
        self.agent_id = descriptor.agent_id
        self.redis = redis
        self.scripts = scripts
        self.token = ""
        self.registered = asyncio.Event()
        self.binding = asyncio.Lock()
        """Held while registering, and while a reader binds its inbox again: a reader that
        found its inbox gone (pruned) must not write the token it knew over the one a
        registration going on at the same moment just wrote (its reports would be refused)."""
        self.leaving = False
        """Set once the agent deregisters: nothing registers it again."""
        self.cut_off = ""
        """Why the registry will not have this process any more ('' while it does)."""
        self._on_fatal = on_fatal
        self._proof = JoinProof(settings)
        self._reregister = asyncio.Event()
        self._reregister.set()
        self._refused_token = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self.heartbeat = HeartbeatThread(settings, self.agent_id, lambda: self.token, stats,
                                         self._heartbeat_refused)

    def past(self, deadline_at_ms: int) -> bool:
        """Whether a deadline (Redis server clock) has passed, as far as this host can tell."""
        if not deadline_at_ms:
            return False
        offset = self.heartbeat.clock_offset_ms
        return offset is None or time.time() * 1000 + offset >= deadline_at_ms

    async def registrar(self) -> None:
        """Registers at start, and again whenever the registry refused our token."""
        self._loop = asyncio.get_running_loop()
        while True:
            await self._reregister.wait()
            self._reregister.clear()
            if self.leaving:
                return
            if self.registered.is_set() and self._refused_token != self.token:
                continue  # (refused more than once; registered again since the first)
            try:
                async with self.binding:
                    self.token = await outages.with_reconnect(self._register)
            except RegistrationRefused as exc:
                self.cut(str(exc))
                return
            if not self.registered.is_set():
                self.registered.set()
                self.heartbeat.start()  # its first beat goes out at once
                log.info("agent %s registered", self.agent_id)
            else:
                self.heartbeat.beat_now()

    async def _register(self) -> str:
        return await register(self.settings, self.redis, self.scripts, self.descriptor, self.described,
                              held_token=self.token, proof=self._proof)

    def refused(self, token: str, what: str, status: Status = Status.REFUSED) -> None:
        """Redis refused `token` (for `what`): register again, once however many calls carried
        it. A token replaced since the call went out says nothing about the new one, and
        registering once more would only make the calls now in flight refused in turn. A
        revoked token cuts the session off."""
        if status is Status.REVOKED and token == self.token:
            self.cut(refusal_message(self.agent_id, Status.REVOKED))
            return
        if token != self.token:
            log.info("%s refused for a token replaced since", what or "heartbeat")
            return
        if self.leaving:
            return  # (deregistered: refusals are expected now)
        if what:
            log.error("%s refused (token); registering again", what)
        self._refused_token = token
        self._reregister.set()

    def _heartbeat_refused(self, token: str, status: Status) -> None:  # (on the heartbeat's thread)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.refused, token, "", status)

    def cut(self, why: str) -> None:
        """The registry will not have this process: stop beating, registering and renewing,
        and tell the worker (it stops)."""
        if self.cut_off:
            return
        self.cut_off = why
        self.leaving = True
        self.heartbeat.stop()
        self._reregister.set()
        log.error("%s", why)
        if self._on_fatal is not None:
            self._on_fatal(why)

    async def keep_token(self) -> None:
        """Renew the token every third of agent_token_ttl_ms (sooner again after a failure),
        so that it never expires while this process works."""
        ttl_s = self.settings.agent_token_ttl_ms / 1000
        if ttl_s <= 0:
            return
        await self.registered.wait()
        delay = ttl_s / 3
        while not self.leaving:
            await asyncio.sleep(delay)
            delay = ttl_s / 3
            if self.leaving:
                return
            try:
                async with self.binding:
                    token = self.token
                    status = await renew_token(self.settings, self.scripts, self.agent_id,
                                               self.descriptor.capabilities, token)
            except outages.TRANSIENT_ERRORS as exc:
                log.warning("token renewal failed (%s); retrying", exc)
                delay = min(delay, 1.0)
                continue
            if status is not Status.OK:
                self.refused(token, "token renewal", status)

    async def rebind(self, capability: str) -> None:
        """Make the capability's inbox again (it was deleted under us: pruned)."""
        if self.leaving:
            return  # (deregistered or cut off: binding again would let the token in again)
        async with self.binding:
            await self.scripts(bind_call(self.settings, capability, self.agent_id, token_sha(self.token),
                                         ttl_ms=self.settings.agent_token_ttl_ms))

    async def leave(self) -> None:
        """Deregister for good and unbind every capability (its inbox goes once empty). A
        refusal from now on (a beat on its way meets the record gone) registers nothing."""
        self.leaving = True
        self.heartbeat.stop()
        with contextlib.suppress(*outages.TRANSIENT_ERRORS):
            await self.scripts(deregister_call(self.settings, self.agent_id, self.token))
            for capability in self.descriptor.capabilities:
                await self.scripts(unbind_call(self.settings, capability, self.agent_id))
