"""The worker: serves its capabilities from one asyncio loop, made of parts that each do one job.

    session   this process as the registry knows it (token, registering again, leaving)
    slots     how many more tasks it may start
    reader    a loop per capability that reads its inbox and starts tasks at once
    attempts  each task's attempt: its handler call, its timeout, handlers that do not stop
    reporter  the starts and outcomes, batched, with the next read riding along; progress
    renewer   the leases of running tasks
    control   cancels from producers

The heartbeat runs on its own thread (registration.py) with the numbers heartbeat_stats gives.
On SIGTERM (or stop()) the worker drains: it says so, hands its unread tasks back, finishes
what it runs within drain_grace_ms, reports everything, deregisters and exits 0.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import os
import re
import secrets
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from agent_worker import control
from agent_worker.attempt import STOP_WAIT_S, Running
from agent_worker.attempts import Attempts
from agent_worker.binding import Binding
from agent_worker.describe import registered
from agent_worker.metrics import WorkerMetrics, WorkerView
from agent_worker.policies import WorkerPolicy
from agent_worker.reader import Entries, Inboxes
from agent_worker.renewer import Renewer
from agent_worker.reporter import Reporter
from agent_worker.session import AgentSession
from agent_worker.slots import Slots
from agent_worker.stats import WorkerStats, rss_kb, stability
from broker import inbox
from broker.errors import ConfigError
from broker.infra import connection, eventloop, fatal, logs, outages
from broker.infra.metrics_server import MetricsServer, serve
from broker.keys import DRAINING_FIELD, CapabilityKeys, RegistryKeys
from broker.models import AgentDescriptor
from broker.registry import AgentState
from broker.scripts import AsyncScripts
from broker.settings import Settings

if TYPE_CHECKING:
    from agent_worker.a2a import A2aBridge
    from agent_worker.http_bridge.bridge import HttpBridge

log = logging.getLogger("reach.worker")

AGENT_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\Z")
TICK_S = 0.1


async def supervised(job: Callable[[], Awaitable[None]], name: str = "", *,
                     first_backoff_s: float = 0.5, healthy_after_s: float = 60.0) -> None:
    """Run a long-lived job; if it fails unexpectedly, log why and start it again (backing off).

    A job that dies silently would leave the process alive but useless (heartbeating while
    reading nothing), which is worse than any crash. The backoff doubles while the job keeps
    failing, and starts over once it ran `healthy_after_s` before failing.
    """
    name = name or getattr(job, "__name__", "job")
    backoff = first_backoff_s
    while True:
        started = time.monotonic()
        try:
            await job()
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if fatal.stops(exc):
                return
            if time.monotonic() - started >= healthy_after_s:
                backoff = first_backoff_s
            log.exception("%s failed unexpectedly; restarting it in %.3gs", name, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 30.0)


def default_agent_id() -> str:
    host = re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname())[:60] or "host"
    return f"{host}-{os.getpid()}-{secrets.token_hex(2)}"


def check_agent_id(agent_id: str) -> str:
    if not AGENT_ID_RE.match(agent_id):
        raise ConfigError(f"invalid agent id {agent_id!r}: use up to 128 letters, digits, '_', '.', '-'")
    return agent_id


class Worker:
    def __init__(self, settings: Settings, bindings: list[Binding], *, concurrency: int = 8,
                 agent_id: str | None = None, region: str | None = None, version: str | None = None,
                 warmup_s: float = 0.0, labels: dict[str, str] | None = None) -> None:
        if concurrency < 1:
            raise ConfigError("--concurrency must be at least 1")
        self.settings = settings
        self.bindings = {b.capability: b for b in bindings}
        self.concurrency = concurrency
        self.agent_id = check_agent_id(agent_id or default_agent_id())
        self.descriptor = AgentDescriptor(
            agent_id=self.agent_id, capabilities=list(self.bindings), max_concurrency=concurrency,
            region=region, version=version, warmup_s=warmup_s, labels=labels or {},
            host=socket.gethostname(), pid=os.getpid(),
        )
        self.stats = WorkerStats()
        logs.set_process_fields(agent_id=self.agent_id)
        self._metrics_address = settings.metrics_address(None)
        self.metrics = (WorkerMetrics(settings, self.agent_id, list(self.bindings))
                        if self._metrics_address is not None else None)
        # (Its connections carry the agent's name: a dispatcher that sees none left hands its
        # tasks on at once, not when their leases lapse: dispatcher/liveness.py.)
        self.redis = connection.async_client(
            settings, client_name=RegistryKeys(settings.prefix).agent_client(self.agent_id))
        scripts = AsyncScripts(self.redis)
        self.session = AgentSession(settings, self.descriptor, self.redis, scripts, self.heartbeat_stats,
                                    registered({c: b.description for c, b in self.bindings.items()}),
                                    on_fatal=self._cut_off)
        self.slots = Slots(concurrency)
        self.running = Running()
        recover = set(self.bindings)
        self.reporter = Reporter(settings, self.session, scripts, self.bindings, self.running,
                                 self.slots, self.stats, recover,
                                 piggyback=len(self.bindings) == 1 and not connection.is_cluster(self.redis),
                                 read_along=self._read_along)
        self._threads = ThreadPoolExecutor(concurrency + 2, thread_name_prefix="reach-handler")
        self.policy = WorkerPolicy(settings, self.redis, list(self.bindings))
        self.attempts = Attempts(
            settings, self.running, self.slots, self.stats, self._threads, self.reporter,
            self.reporter.progress, self.session.heartbeat.beat_now, self._all_held,
            lambda b: self.policy.retry_failures(b.capability, b.retry_failures), metrics=self.metrics,
            agent_id=self.agent_id)
        self.inboxes = Inboxes(settings, self.session, self.redis, scripts, self.bindings, self.slots,
                               self.running, recover, self.attempts.start)
        self.renewer = Renewer(settings, self.session, scripts, self.running)
        self.bridge = self._http_bridge(scripts)
        self.a2a = self._a2a_bridge(scripts)
        self._stop = asyncio.Event()
        self._signals = 0
        self._exit_code = 0
        self._fatal = fatal.Guard("agent", lambda _: None)  # (run() installs the real one)
        self._last_tick = time.monotonic()
        self._max_lag_ms = 0.0
        self._rss_start_kb = rss_kb()

    def _http_bridge(self, scripts: AsyncScripts) -> HttpBridge | None:
        """What the HTTP agents among the handlers share (agent_worker/http_bridge), if any."""
        if "agent_worker.http_bridge.agent" not in sys.modules:
            return None  # (no binding made an HttpAgent: httpx need not be imported)
        from agent_worker.http_bridge.agent import HttpAgent
        from agent_worker.http_bridge.bridge import HttpBridge, WorkerLink

        agents = [b.handler for b in self.bindings.values() if isinstance(b.handler, HttpAgent)]
        if not agents:
            return None
        link = WorkerLink(self.settings, self.redis, scripts, self.agent_id, self.running, self.slots,
                          self.session.heartbeat.beat_now, self._release_unread)
        return HttpBridge(link, agents)

    def _a2a_bridge(self, scripts: AsyncScripts) -> A2aBridge | None:
        """What the A2A agents among the handlers share (agent_worker/a2a), if any."""
        if "agent_worker.a2a" not in sys.modules:
            return None  # (no binding made an A2aAgent: a2a-sdk need not be installed)
        from agent_worker.a2a import A2aAgent, A2aBridge
        from agent_worker.http_bridge.bridge import WorkerLink

        agents = [b.handler for b in self.bindings.values() if isinstance(b.handler, A2aAgent)]
        if not agents:
            return None
        link = WorkerLink(self.settings, self.redis, scripts, self.agent_id, self.running, self.slots,
                          self.session.heartbeat.beat_now, self._release_unread)
        return A2aBridge(link, agents)

    async def _release_unread(self) -> int:
        released = 0
        for capability in self.bindings:
            released += await inbox.release_unread(self.redis, self.session.scripts, self.settings,
                                                   capability, self.agent_id, "agent not ready")
        return released

    async def _read_along(self, binding: Binding, entries: Entries) -> None:
        await self.inboxes.begin(binding, entries)

    # -- lifecycle --------------------------------------------------------------------------

    async def run(self, *, install_signals: bool = True) -> int:
        """Serve until asked to stop (SIGTERM/SIGINT or `stop()`), then drain. Returns the exit
        code: 0, or 1 when handlers that did not stop held every slot."""
        loop = asyncio.get_running_loop()
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._on_signal)
        # (Before any loop starts: they all stop the worker on a refusal by Redis's ACL.)
        self._fatal = fatal.guard("agent", lambda _: loop.call_soon_threadsafe(self._all_held))  # (exit 1)
        log.info("agent %s starting: %s (%s loop)", self.agent_id,
                 ", ".join(f"{c} <- {b.source}" for c, b in self.bindings.items()),
                 eventloop.loop_name(loop))
        server = self._serve_metrics()
        await asyncio.to_thread(connection.check_eviction, self.settings)
        # Registration retries in the background while Redis is away; the readers wait for it.
        readers = [asyncio.create_task(supervised(functools.partial(self.inboxes.reader, b), f"reader-{c}"),
                                       name=f"reader-{c}") for c, b in self.bindings.items()]
        jobs: dict[str, Callable[[], Awaitable[None]]] = {
            "flusher": self.reporter.flusher, "renewer": self.renewer.run, "ticker": self._ticker,
            "registrar": self.session.registrar, "tokens": self.session.keep_token,
            "policy": self.policy.run,
            "control": functools.partial(control.listen, self.redis, self.settings.prefix,
                                         self.agent_id, self.running,
                                         self.bridge.on_control if self.bridge else None),
            **(self.bridge.jobs() if self.bridge else {}),
            **(self.a2a.jobs() if self.a2a else {}),
        }
        helpers = [asyncio.create_task(supervised(job, name), name=name) for name, job in jobs.items()]
        log.info("agent %s ready (concurrency %d)", self.agent_id, self.concurrency)
        await self._stop.wait()
        if self._fatal.error is None:
            await self._drain(readers)
        else:  # (nothing it sends is allowed: its tasks' leases lapse and others run them)
            for reader in readers:
                reader.cancel()
        for job in helpers:
            job.cancel()
        _, stuck = await asyncio.wait(helpers, timeout=5.0)
        if stuck:
            log.warning("%d helper job(s) did not stop in time", len(stuck))
        self.session.heartbeat.stop()
        if self.bridge is not None:
            await self.bridge.aclose()
        if self.a2a is not None:
            await self.a2a.aclose()
        self._threads.shutdown(wait=False, cancel_futures=True)
        with contextlib.suppress(*outages.TRANSIENT_ERRORS, TimeoutError):
            await asyncio.wait_for(self.redis.aclose(), 5.0)
        if server is not None:
            server.stop()
        log.info("agent %s stopped", self.agent_id)
        return self._exit_code

    def stop(self) -> None:
        self.slots.close()
        self._stop.set()

    def _on_signal(self) -> None:
        self._signals += 1
        if self._signals > 1:
            log.warning("second signal: exiting now")
            os._exit(1)
        log.info("signal received: draining (again to exit at once)")
        self.stop()

    def _all_held(self) -> None:
        """Handlers that do not stop hold every slot: stop (handing the unread tasks back,
        exit code 1) so that whatever supervises this process starts a fresh one."""
        self._exit_code = 1
        self.stop()

    def _cut_off(self, why: str) -> None:
        """The registry will not have this process (the session logged why): stop at once,
        exit code 1. What it held was (or will be) handed to other agents."""
        self._exit_code = 1
        self.stop()

    def still_running(self) -> int:
        """After run(): handlers that have not returned, of tasks given up."""
        return self.attempts.still_running()

    async def _drain(self, readers: list[asyncio.Task[None]]) -> None:
        grace = self.settings.drain_grace_ms / 1000
        log.info("draining: %d task(s) in flight, grace %.0fs", len(self.running), grace)
        if not self.session.registered.is_set() or self.session.cut_off:
            for reader in readers:
                reader.cancel()
            for attempt in self.running.attempts():
                attempt.cancel()  # (cut off: its reports would be refused, its tasks run elsewhere)
            return
        self.session.heartbeat.beat_now("draining")
        await self._mark_draining()
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
        for capability in self.bindings:  # unread tasks go to other agents at once
            with contextlib.suppress(*outages.TRANSIENT_ERRORS):
                released = await inbox.release_unread(self.redis, self.session.scripts, self.settings,
                                                      capability, self.agent_id, "agent draining")
                if released:
                    log.info("handed %d unread %s task(s) back to the queue", released, capability)
        await self._finish_running(grace)
        self.reporter.flush_now()
        while self.reporter.pending:
            await asyncio.sleep(0.01)  # (every outcome is reported before the agent leaves)
        await self.session.leave()

    async def _mark_draining(self) -> None:
        """Dispatchers read the registry a moment late; this marker, next to the agent's token
        in each capability's own hash slot, stops dispatch.lua and grants at once."""
        for capability in self.bindings:
            with contextlib.suppress(*outages.TRANSIENT_ERRORS):
                await self.redis.hset(CapabilityKeys(self.settings.prefix, capability).tokens,
                                      f"{DRAINING_FIELD}{self.agent_id}", "1")

    async def _finish_running(self, grace: float) -> None:
        """Let running tasks finish within the grace; then stop them ("worker stopped",
        retryable: they run again elsewhere) and give up those that do not stop."""
        deadline = time.monotonic() + grace
        while self.running and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for attempt in self.running.attempts():
            # (Not a cancel by the producer: the attempt is cut short, and reported as such.)
            if attempt.task is not None:
                attempt.task.cancel()
        deadline = time.monotonic() + STOP_WAIT_S
        while self.running and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for attempt in self.running.attempts():
            self.attempts.abandon(
                attempt, "worker stopped before the task finished (it did not stop when told)")

    # -- metrics and probes -----------------------------------------------------------------

    def _serve_metrics(self) -> MetricsServer | None:
        if self.metrics is None or self._metrics_address is None:
            return None
        self.metrics.watch(WorkerView(
            inflight=lambda: collections.Counter(a.capability for a in self.running.attempts()),
            slots=lambda: self.concurrency, held_slots=lambda: self.slots.held,
            loop_lag_s=lambda: self._max_lag_ms / 1000))
        try:
            return serve(self.metrics.registry, self._healthz, self._readyz, self._metrics_address,
                         f"agent {self.agent_id}")
        except OSError as exc:
            raise ConfigError(f"cannot serve metrics on {self.settings.metrics_addr}: {exc}") from exc

    def _healthz(self) -> dict[str, Any]:
        """Its event loop runs, and so does its heartbeat once registered."""
        age = time.monotonic() - self._last_tick
        beating = (not self.session.registered.is_set() or self.session.heartbeat.is_alive()
                   or self.session.leaving)
        return {"event_loop": age < self.settings.stall_after_ms / 1000,
                "_event_loop_age_s": round(age, 3), "heartbeat": beating}

    def _readyz(self) -> dict[str, Any]:
        """It can take tasks: registered, Redis answers, not draining, and the registry does not
        judge it not_ready (a stuck executor)."""
        assert self.metrics is not None
        state = self.metrics.state()
        return {"registered": self.session.registered.is_set() and not self.session.leaving,
                "redis": state is not None, "not_draining": not self.slots.closed,
                "not_not_ready": state is not AgentState.NOT_READY,
                "_state": state.value if state is not None else None}

    # -- health -----------------------------------------------------------------------------

    async def _ticker(self) -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(TICK_S)
            now = time.monotonic()
            lag_ms = (now - before - TICK_S) * 1000
            self._max_lag_ms = max(self._max_lag_ms * 0.9, lag_ms)
            self._last_tick = now

    def heartbeat_stats(self) -> dict[str, Any]:
        """Numbers for the registry (advisory; routing counts load from Redis itself)."""
        rss = rss_kb()
        health = self.stats.health()
        progress_age_ms = round((time.monotonic() - self._last_tick) * 1000)
        return {
            "inflight": len(self.running),
            "max_concurrency": self.concurrency,
            "free_slots": self.slots.free,
            "held_slots": self.slots.held,
            "loop_progress_age_ms": progress_age_ms,
            "stalled": progress_age_ms >= self.settings.stall_after_ms and bool(self.running),
            "loop_lag_ms": round(self._max_lag_ms, 1),
            "latency_p50_ms": self.stats.latency_p50_ms(),
            "latency_baseline_ms": self.stats.latency_baseline_ms(),
            "success_rates": self.stats.success_rates(),
            "health": health,
            "stability": stability(health, self._max_lag_ms),
            "done": self.stats.done,
            "failed": self.stats.failed,
            "rejected": self.stats.rejected,
            "rss_kb": rss,
            "rss_growth_kb": rss - self._rss_start_kb if rss and self._rss_start_kb else None,
            "draining": self.slots.closed,
            **(self.bridge.heartbeat_stats() if self.bridge else {}),
            **(self.a2a.heartbeat_stats() if self.a2a else {}),
        }
