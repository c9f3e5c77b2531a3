"""The dispatcher process: serves every capability it finds (or the ones it is given).

Several dispatchers may run at once with no leader: every hand-off is one atomic script, so a
task taken by one is skipped by the others. Wake-ups (broker/protocol/wake.py) arrive on the
`<prefix>:wake` channel; pub/sub only shortens waits, and the idle tick (default 1 s) makes
progress if a message is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from typing import Any

from broker.errors import ConfigError
from broker.ids import CAPABILITY_RE
from broker.infra import connection, eventloop, fatal, outages
from broker.infra.metrics_server import MetricsServer, serve
from broker.keys import RegistryKeys
from broker.protocol import wake
from broker.retention import prune_task_index, trim
from broker.settings import DISPATCHER_METRICS_ADDR, Settings
from dispatcher.capability import CapabilityLoop
from dispatcher.context import DispatcherContext
from dispatcher.health import HealthWatcher
from dispatcher.liveness import AgentConnections
from dispatcher.metrics import TICK_S, DispatcherMetrics
from dispatcher.policy import seed
from dispatcher.scheduler import Scheduler

log = logging.getLogger("reach.dispatcher")

STOP_TIMEOUT_S = 5.0
RETENTION_EVERY_S = 60.0


class Dispatcher:
    def __init__(self, settings: Settings, capabilities: list[str] | None = None,
                 dispatcher_id: str | None = None) -> None:
        self.settings = settings
        self.only = frozenset(capabilities) if capabilities else None
        self.dispatcher_id = dispatcher_id
        self.loops: dict[str, CapabilityLoop] = {}
        self._connections: AgentConnections | None = None
        """Which agents are connected to Redis, shared by the loops (liveness.py)."""
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._registry_dirty = asyncio.Event()
        self._stop = asyncio.Event()
        self.ctx: DispatcherContext | None = None
        self._helpers: list[asyncio.Task[None]] = []
        self._fatal = fatal.Guard("dispatcher", lambda _: None)  # (run() installs the real one)

    async def run(self, *, install_signals: bool = True) -> int:
        """Route until asked to stop; the exit code: 0, or 1 when Redis's ACL refused this
        dispatcher's user something (no retry fixes that: broker/infra/fatal.py)."""
        loop = asyncio.get_running_loop()
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._stop.set)
        self._fatal = fatal.guard("dispatcher", lambda _: loop.call_soon_threadsafe(self._stop.set))
        metrics, server = self._serve_metrics()
        ctx = self.ctx = DispatcherContext.connect(self.settings, dispatcher_id=self.dispatcher_id,
                                                   only=self.only, metrics=metrics)
        health = HealthWatcher(ctx)
        log.info("dispatcher %s (tag %s) starting on %s (prefix %r, %s loop)", ctx.dispatcher_id,
                 ctx.tag, self.settings.redacted_url(), self.settings.prefix,
                 eventloop.loop_name(asyncio.get_running_loop()))
        await asyncio.to_thread(connection.check_eviction, self.settings)
        try:
            await outages.with_reconnect(lambda: seed(ctx))
            await outages.with_reconnect(lambda: self._refresh(ctx, health))
        except Exception as exc:
            if not fatal.stops(exc):
                raise
        helpers = [
            asyncio.create_task(self._wake_listener(ctx), name="wake-listener"),
            asyncio.create_task(self._refresher(ctx, health), name="registry-refresher"),
            asyncio.create_task(self._retention(), name="dlq-retention"),
            asyncio.create_task(Scheduler(ctx).run(), name="scheduler"),
        ]
        if metrics is not None:
            helpers.append(asyncio.create_task(_tick(metrics), name="loop-ticker"))
        self._helpers = helpers
        await self._stop.wait()
        everything = [*helpers, *self._tasks.values()]
        for task in everything:
            task.cancel()
        _, stuck = await asyncio.wait(everything, timeout=STOP_TIMEOUT_S)
        if stuck:
            log.warning("%d job(s) did not stop within %.0fs", len(stuck), STOP_TIMEOUT_S)
        with contextlib.suppress(*outages.TRANSIENT_ERRORS):
            await asyncio.wait_for(ctx.close(), STOP_TIMEOUT_S)
        if server is not None:
            server.stop()
        log.info("dispatcher %s stopped", ctx.dispatcher_id)
        return 0 if self._fatal.error is None else 1

    def stop(self) -> None:
        self._stop.set()

    # -- metrics and probes -----------------------------------------------------------------

    def _serve_metrics(self) -> tuple[DispatcherMetrics | None, MetricsServer | None]:
        """Its metrics server, where the settings ask for one (by default 127.0.0.1:9464: when
        that is taken, this dispatcher runs without; an address given must be had)."""
        address = self.settings.metrics_address(DISPATCHER_METRICS_ADDR)
        if address is None:
            return None, None
        metrics = DispatcherMetrics(self.settings)
        try:
            return metrics, serve(metrics.registry, self._healthz, self._readyz, address, "dispatcher")
        except OSError as exc:
            if self.settings.metrics_addr is not None:
                raise ConfigError(f"cannot serve metrics on {self.settings.metrics_addr}: {exc}") from exc
            log.warning("no metrics: the default address %s cannot be had (%s); set metrics_addr "
                        "(port 0 picks a free one) or 'off'", DISPATCHER_METRICS_ADDR, exc)
            return None, None

    def _healthz(self) -> dict[str, Any]:
        """Its event loop runs, and none of its loops has ended (each retries what fails)."""
        metrics = self.ctx.metrics if self.ctx is not None else None
        age = metrics.loop_age_s() if metrics is not None else 0.0
        jobs = [*self._helpers, *self._tasks.values()]
        return {"event_loop": age < self.settings.stall_after_ms / 1000, "_event_loop_age_s": round(age, 3),
                "loops_running": self._stop.is_set() or not any(job.done() for job in jobs)}

    def _readyz(self) -> dict[str, Any]:
        """It can route: Redis answers, and it is not stopping."""
        metrics = self.ctx.metrics if self.ctx is not None else None
        return {"redis": metrics is not None and metrics.redis_ok(), "not_stopping": not self._stop.is_set(),
                "_capabilities": len(self.loops)}

    # -- capabilities and the registry ------------------------------------------------------

    async def _refresh(self, ctx: DispatcherContext, health: HealthWatcher) -> None:
        await ctx.view.refresh()
        known = await ctx.redis.smembers(RegistryKeys(self.settings.prefix).capabilities)
        names = {str(name) for name in known}
        for name in names | ctx.view.capabilities():
            self._ensure_loop(ctx, name)
        await health.react()
        for loop in self.loops.values():
            await loop.observations.refresh([r.agent_id for r in ctx.view.serving(loop.capability)])
            loop.kick()

    def _ensure_loop(self, ctx: DispatcherContext, capability: str) -> CapabilityLoop | None:
        if not ctx.serves(capability) or not CAPABILITY_RE.match(capability):
            return None
        loop = self.loops.get(capability)
        if loop is None:
            if self._connections is None:
                self._connections = AgentConnections(ctx)
            loop = self.loops[capability] = CapabilityLoop(ctx, capability, self._connections)
            self._tasks[capability] = asyncio.create_task(loop.run(), name=f"cap-{capability}")
            log.info("serving capability %s", capability)
        return loop

    async def _refresher(self, ctx: DispatcherContext, health: HealthWatcher) -> None:
        tick = self.settings.idle_tick_ms / 1000
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._registry_dirty.wait(), tick)
            self._registry_dirty.clear()
            try:
                await self._refresh(ctx, health)
            except outages.TRANSIENT_ERRORS as exc:
                log.warning("registry refresh failed (%s)", exc)
                await asyncio.sleep(min(tick, 1.0))
            except Exception as exc:
                if fatal.stops(exc):
                    return
                log.exception("registry refresh failed unexpectedly")
                await asyncio.sleep(min(tick, 1.0))

    async def _retention(self) -> None:
        """Trim each capability's dead-letter stream to its retention and its task index to the
        result TTL, once a minute."""
        client = None
        while True:
            await asyncio.sleep(RETENTION_EVERY_S)
            try:
                if client is None:
                    client = connection.sync_client(self.settings)
                for capability in list(self.loops):
                    await asyncio.to_thread(trim, client, self.settings, capability)
                    await asyncio.to_thread(prune_task_index, client, self.settings, capability)
            except Exception as exc:  # retention must never stop the dispatcher
                if fatal.stops(exc):
                    return
                log.warning("DLQ retention skipped this time (%s)", exc)

    # -- wake-ups ---------------------------------------------------------------------------

    async def _wake_listener(self, ctx: DispatcherContext) -> None:
        channel = wake.channel_name(self.settings)
        backoff = 0.1
        while True:
            pubsub = None
            try:
                pubsub = await connection.open_async_pubsub(ctx.redis)
                await pubsub.subscribe(channel)
                backoff = 0.1
                for loop in self.loops.values():
                    loop.kick()  # anything may have happened while we were not listening
                while True:
                    message = await pubsub.get_message(timeout=5.0)
                    if message and message.get("type") == "message":
                        self.on_wake(str(message["data"]))
            except Exception as exc:  # (transient or not: pub/sub only shortens waits)
                if fatal.stops(exc) or self._stop.is_set():
                    return  # (stopping: a read cut short by the close is no reason to listen again)
                log.warning("wake channel lost (%s); resubscribing in %.1fs", exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
            finally:
                if pubsub is not None:
                    with contextlib.suppress(*outages.TRANSIENT_ERRORS):
                        await pubsub.aclose()

    def on_wake(self, text: str) -> None:
        message = wake.parse(text)
        if isinstance(message, wake.RegistryChanged):
            self._registry_dirty.set()
        elif isinstance(message, wake.TasksQueued):
            if self.ctx is not None and (loop := self._ensure_loop(self.ctx, message.capability)):
                loop.kick(new_tasks=True)
        elif isinstance(message, wake.AgentFreed):
            if (loop := self.loops.get(message.capability)) is not None:
                _on_freed(loop, message)
        elif isinstance(message, wake.PolicyChanged):
            for name, loop in self.loops.items():
                if message.capability in (name, "*"):
                    loop.on_policy()
        elif isinstance(message, wake.GrantsTaken) and (loop := self.loops.get(message.capability)):
            loop.observations.note_load(message.agent_id, message.inbox_len, message.inbox_pending)
            loop.on_took(message.taken, message.left)


async def _tick(metrics: DispatcherMetrics) -> None:
    """Note that the event loop runs (/healthz)."""
    while True:
        metrics.last_tick = time.monotonic()
        await asyncio.sleep(TICK_S)


def _on_freed(loop: CapabilityLoop, message: wake.AgentFreed) -> None:
    observations = loop.observations
    observations.note_load(message.agent_id, message.inbox_len, message.inbox_pending)
    changed = False
    if message.failures is not None:
        changed = observations.note_failures(message.agent_id, message.failures)
    if message.exec_ms is not None:
        observations.note_speed(message.agent_id, message.finished, message.exec_ms)
    if message.speed is not None:
        changed = observations.note_told_speed(message.agent_id, *message.speed) or changed
    loop.on_free(changed, message.finished, message.pulled)
