"""The dispatcher process: serves every capability it finds (or the ones it is given).

Several dispatchers may run at once with no leader: every hand-off is one atomic script, so a
task taken by one is skipped by the others. Wake-ups arrive on the `<prefix>:wake` channel:

    task <cap>                          new or due tasks were queued
    free <cap> <agent> <len> <pending> <failures> <n> <exec ms> <pulled>
                                        an agent finished n tasks in exec ms in all (its exact
                                        inbox load after, its consecutive failures) and took
                                        `pulled` ready tasks in their place (standing pull)
    took <cap> <agent> <len> <pending> <n> <left>
                                        a submit handed n tasks straight to the agent (grants),
                                        leaving `left` grants: sent when that falls to a power
                                        of two or to none (without `left`: by a producer of the
                                        release before, after every hand-off)
    agent <agent>                       the registry changed

Pub/sub only shortens waits; the idle tick (default 1 s) guarantees progress if a message is
lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import socket
from typing import Any

from broker import connection, eventloop
from broker.ids import CAPABILITY_RE
from broker.keys import Channels, RegistryKeys
from broker.scripts import AsyncScripts
from broker.settings import Settings
from dispatcher.capability import CapabilityLoop
from dispatcher.health import HealthWatcher
from dispatcher.registry_view import RegistryView

log = logging.getLogger("reach.dispatcher")

STOP_TIMEOUT_S = 5.0
RETENTION_EVERY_S = 60.0


class Dispatcher:
    def __init__(self, settings: Settings, capabilities: list[str] | None = None,
                 dispatcher_id: str | None = None) -> None:
        self.settings = settings
        self.only = set(capabilities) if capabilities else None
        self.dispatcher_id = dispatcher_id or (
            f"dispatcher-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"
        )
        self.tag = secrets.token_hex(3)
        """A short name for this dispatcher in the routing decisions it records (see
        routing.explanation); its log says which dispatcher id it stands for."""
        self.loops: dict[str, CapabilityLoop] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._registry_dirty = asyncio.Event()

    async def run(self, *, install_signals: bool = True) -> int:
        self._stop = asyncio.Event()
        if install_signals:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._stop.set)
        self.redis: Any = connection.async_client(self.settings)
        self.scripts = AsyncScripts(self.redis)
        self.view = RegistryView(self.settings, self.redis)
        self.health = HealthWatcher(self)
        log.info("dispatcher %s (tag %s) starting on %s (prefix %r, %s loop)", self.dispatcher_id,
                 self.tag, self.settings.redacted_url(), self.settings.prefix,
                 eventloop.loop_name(asyncio.get_running_loop()))
        await asyncio.to_thread(connection.check_eviction, self.settings)
        await connection.with_reconnect(self._refresh)
        helpers = [
            asyncio.create_task(self._wake_listener(), name="wake-listener"),
            asyncio.create_task(self._refresher(), name="registry-refresher"),
            asyncio.create_task(self._retention(), name="dlq-retention"),
        ]
        await self._stop.wait()
        everything = [*helpers, *self._tasks.values()]
        for task in everything:
            task.cancel()
        _, stuck = await asyncio.wait(everything, timeout=STOP_TIMEOUT_S)
        if stuck:
            log.warning("%d job(s) did not stop within %.0fs", len(stuck), STOP_TIMEOUT_S)
        with contextlib.suppress(*connection.TRANSIENT_ERRORS):
            await asyncio.wait_for(self.redis.aclose(), STOP_TIMEOUT_S)
        log.info("dispatcher %s stopped", self.dispatcher_id)
        return 0

    def stop(self) -> None:
        self._stop.set()

    # -- capabilities and the registry ------------------------------------------------------

    async def _refresh(self) -> None:
        await self.view.refresh()
        names = await self.redis.smembers(RegistryKeys(self.settings.prefix).capabilities)
        for name in set(names) | self.view.capabilities():
            self._ensure_loop(name)
        await self.health.react()
        for loop in self.loops.values():
            await loop.refresh_loads([r.agent_id for r in self.view.serving(loop.capability)])
            loop.kick()

    def _ensure_loop(self, capability: str) -> CapabilityLoop | None:
        if self.only is not None and capability not in self.only:
            return None
        if not CAPABILITY_RE.match(capability):
            return None
        loop = self.loops.get(capability)
        if loop is None:
            loop = self.loops[capability] = CapabilityLoop(self, capability)
            self._tasks[capability] = asyncio.create_task(loop.run(), name=f"cap-{capability}")
            log.info("serving capability %s", capability)
        return loop

    async def _refresher(self) -> None:
        tick = self.settings.idle_tick_ms / 1000
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._registry_dirty.wait(), tick)
            self._registry_dirty.clear()
            try:
                await self._refresh()
            except connection.TRANSIENT_ERRORS as exc:
                log.warning("registry refresh failed (%s)", exc)
                await asyncio.sleep(min(tick, 1.0))
            except Exception:
                log.exception("registry refresh failed unexpectedly")
                await asyncio.sleep(min(tick, 1.0))

    async def _retention(self) -> None:
        """Trim each capability's dead-letter stream to its retention, once a minute."""
        from dlq_tools import trim

        client = None
        while True:
            await asyncio.sleep(RETENTION_EVERY_S)
            try:
                if client is None:
                    client = connection.sync_client(self.settings)
                for capability in list(self.loops):
                    await asyncio.to_thread(trim, client, self.settings, capability)
            except Exception as exc:  # retention must never stop the dispatcher
                log.warning("DLQ retention skipped this time (%s)", exc)

    # -- wake-ups ---------------------------------------------------------------------------

    async def _wake_listener(self) -> None:
        channel = Channels(self.settings.prefix).wake
        backoff = 0.1
        while True:
            pubsub = None
            try:
                pubsub = await connection.open_async_pubsub(self.redis)
                await pubsub.subscribe(channel)
                backoff = 0.1
                for loop in self.loops.values():
                    loop.kick()  # anything may have happened while we were not listening
                while True:
                    message = await pubsub.get_message(timeout=5.0)
                    if message and message.get("type") == "message":
                        self.on_wake(str(message["data"]))
            except Exception as exc:  # (transient or not: pub/sub only shortens waits)
                log.warning("wake channel lost (%s); resubscribing in %.1fs", exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
            finally:
                if pubsub is not None:
                    with contextlib.suppress(*connection.TRANSIENT_ERRORS):
                        await pubsub.aclose()

    def on_wake(self, text: str) -> None:
        parts = text.split(" ")
        kind = parts[0]
        if kind == "task" and len(parts) == 2:
            loop = self._ensure_loop(parts[1])
            if loop is not None:
                loop.kick(new_tasks=True)
        elif kind == "free" and len(parts) >= 5:
            loop = self.loops.get(parts[1])
            if loop is not None:
                changed, finished, pulled = False, 1, 0
                with contextlib.suppress(ValueError):
                    loop.note_load(parts[2], int(parts[3]), int(parts[4]))
                    if len(parts) >= 6:
                        changed = loop.note_failures(parts[2], int(parts[5]))
                    if len(parts) >= 8:
                        finished = int(parts[6])
                        loop.note_speed(parts[2], finished, float(parts[7]))
                    if len(parts) >= 9:
                        pulled = int(parts[8])
                loop.on_free(changed, finished, pulled)
        elif kind == "took" and len(parts) in (6, 7):
            loop = self.loops.get(parts[1])
            if loop is not None:
                with contextlib.suppress(ValueError):
                    loop.note_load(parts[2], int(parts[3]), int(parts[4]))
                    loop.on_took(int(parts[5]), int(parts[6]) if len(parts) == 7 else None)
        elif kind == "agent":
            self._registry_dirty.set()
