"""Keeping the leases of running tasks: every lease/3 the worker claims each running task's
inbox entry back (renew.lua resets its idle time, which is the lease), and stops the attempts
whose task moved on (canceled, expired, reclaimed: the fence moved). A lease that lapses (the
worker died or froze) is reclaimed by a dispatcher (dispatcher/leases.py)."""

from __future__ import annotations

import asyncio
import logging

from agent_worker.attempt import Attempt, Running, about
from agent_worker.session import AgentSession
from broker.infra import outages
from broker.protocol.calls import Status
from broker.protocol.reports import parse_renew, renew_call
from broker.scripts import AsyncScripts
from broker.settings import Settings

log = logging.getLogger("reach.worker")


class Renewer:
    def __init__(self, settings: Settings, session: AgentSession, scripts: AsyncScripts,
                 running: Running) -> None:
        self.settings = settings
        self.session = session
        self.scripts = scripts
        self.running = running

    async def run(self) -> None:
        interval = self.settings.lease_ms / 3000
        while True:
            await asyncio.sleep(interval)
            by_capability: dict[str, list[Attempt]] = {}
            for attempt in self.running.attempts():
                by_capability.setdefault(attempt.capability, []).append(attempt)
            for capability, attempts in by_capability.items():
                await self._renew(capability, attempts)

    async def _renew(self, capability: str, attempts: list[Attempt]) -> None:
        session = self.session
        token = session.token
        call = renew_call(self.settings, capability, session.agent_id, token, [a.lease for a in attempts])
        try:
            reply = parse_renew(await self.scripts(call))
        except outages.TRANSIENT_ERRORS as exc:
            log.warning("lease renewal failed (%s); will retry", exc)
            return
        if reply.refused:
            session.refused(token, f"lease renewal of {capability} tasks")
            return
        for status, attempt in zip(reply.statuses, attempts, strict=True):
            if status != Status.OK and self.running.is_current(attempt):  # (not just finished)
                log.warning("task %s: attempt superseded (%s); stopping it", attempt.task_id, status,
                            extra=about(attempt))
                attempt.cancel()
