"""A row of the comparison table, and the procedure every row runs once per repetition.

Per repetition a row runs two phases on fresh key namespaces, with nothing else running:

A. enqueue `n` tasks one `submit` at a time (timed: enqueue rate), start ONE worker process and
   wait until it is ready, release it (for Reach: start the dispatcher; for the others: a `GO`
   line on the launcher's stdin), wait until every result is stored (drain rate, from the first
   completion to the last result stored, as the stored timestamps say), then `rt_n` sequential
   round trips submit -> result on that same idle worker (p50, p99), and its peak RSS.
B. enqueue `n` tasks with the bulk API (timed), start TWO worker processes, release them
   together, wait for the drain (two-worker drain rate).

Workers start before they are released so that start-up never counts. Around each drain the
harness reads INFO commandstats/cpu and the CPU time of every process of the row, so the JSON
says how many Redis commands and how much CPU each task cost.
"""

from __future__ import annotations

import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from bench.context import Bench, drain_timeout
from bench.procs import Proc, ProcessFailed, cpu_seconds, machine_busy_seconds, stop_all
from bench.stats import percentile

PAYLOAD_KEY = "i"
STALL_S = 60.0
"""A drain in which no task finished for this long has failed (e.g. its workers went offline)."""


def payload(i: int) -> dict[str, int]:
    """The no-op task's payload (every row sends and gets back the same small JSON object)."""
    return {PAYLOAD_KEY: i}


@dataclass
class Drain:
    """When the first and the last result of a drain were stored (ms, one clock per row)."""

    first_ms: float
    last_ms: float
    n: int
    clock: str

    @property
    def seconds(self) -> float:
        return (self.last_ms - self.first_ms) / 1000

    @property
    def rate(self) -> float | None:
        # n results span n-1 intervals between the first and the last.
        return (self.n - 1) / self.seconds if self.seconds > 0 else None


@dataclass
class Workers:
    """The processes of a row during one phase (workers, plus Reach's dispatcher)."""

    workers: list[Proc]
    helpers: list[Proc] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def all(self) -> list[Proc]:
        return [*self.workers, *self.helpers]

    def check(self) -> None:
        for proc in self.all:
            proc.check_alive()

    def cpu(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for proc in self.all:
            out[proc.name] = proc.cpu_seconds() or 0.0
        return out


class Row(ABC):
    """One system under test."""

    key: ClassVar[str]
    title: ClassVar[str]
    clock: ClassVar[str] = ""
    """Where the drain timestamps come from (shown in the JSON)."""
    bulk_note: ClassVar[str | None] = None
    """Why there is no bulk enqueue figure, if there is none."""
    max_n: ClassVar[int | None] = None
    """At most this many tasks per enqueue/drain (a row whose cost per task is constant and so
    slow that 10,000 would take most of an hour); said in the row's note."""
    opt_in: ClassVar[bool] = False
    """Runs only when named in --only (a variant of another row, not a system of its own)."""

    def __init__(self, bench: Bench) -> None:
        self.b = bench
        self.ns = ""

    # -- what each row implements -----------------------------------------------------------

    def unavailable(self) -> str | None:
        """Why this row cannot run here (skipped with that note), or None."""
        return None

    def prepare(self) -> None:  # noqa: B027 - optional hook
        """One-time set-up before the first repetition (e.g. npm install)."""

    def settings(self) -> dict[str, Any]:
        """How the system is configured, for the JSON and the docs."""
        return {}

    def begin(self) -> None:
        """Start a phase on a fresh namespace."""
        self.ns = self.b.prefix(self.key)

    @abstractmethod
    def enqueue(self, n: int, bulk: bool) -> float | None:
        """Enqueue n no-op tasks; seconds it took (None: no bulk API)."""

    @abstractmethod
    def start_workers(self, count: int) -> Workers:
        """Start `count` worker processes and wait until they are ready but not consuming."""

    @abstractmethod
    def release(self, ws: Workers) -> None:
        """Let the workers start consuming."""

    @abstractmethod
    def remaining(self, n: int, ws: Workers) -> int:
        """How many of the n tasks have no result stored yet (cheap; polled; 0 ends the drain)."""

    @abstractmethod
    def drain_times(self, n: int, ws: Workers) -> Drain:
        """First and last result-stored times of the drain that just finished."""

    @abstractmethod
    def round_trips(self, n: int, ws: Workers) -> list[float]:
        """n sequential submit -> result latencies in ms, on the idle released workers."""

    def stop_workers(self, ws: Workers) -> None:
        stop_all(ws.all, 10.0)

    @abstractmethod
    def cleanup(self) -> None:
        """Delete every key of the current namespace."""

    # -- the procedure ----------------------------------------------------------------------

    @property
    def n(self) -> int:
        return min(self.b.sizes.n, self.max_n or self.b.sizes.n)

    def wait_drained(self, n: int, ws: Workers) -> None:
        """Until every result is stored; fails when nothing moved for STALL_S or past the timeout."""
        start = time.monotonic()
        deadline = start + drain_timeout(n)
        interval = 0.005
        last, moved_at = n + 1, start
        while (left := self.remaining(n, ws)) > 0:
            ws.check()
            now = time.monotonic()
            if left != last:
                last, moved_at = left, now
            elif now - moved_at > STALL_S:
                raise ProcessFailed(f"{self.title}: drain stalled, {left:,} of {n:,} tasks without a "
                                    f"result and none finished for {STALL_S:.0f}s "
                                    f"(logs: {ws.workers[0].log_path.parent})")
            if now > deadline:
                raise ProcessFailed(f"{self.title}: {n} tasks not drained within {drain_timeout(n):.0f}s")
            time.sleep(interval)
            interval = min(interval * 1.5, 0.05)

    def measured_drain(self, n: int, ws: Workers) -> dict[str, Any]:
        """Release the workers, wait for the drain, return its figures.

        `foreign_cpu_pct` is the CPU the rest of the machine used meanwhile (busy time of all
        CPUs minus this row's processes, Redis and the harness), as a share of all CPUs: a
        drain measured while something else was busy says so in the JSON.
        """
        before = self.b.target.snapshot()
        cpu0 = ws.cpu()
        busy0, own0, t0 = machine_busy_seconds(), cpu_seconds(os.getpid()) or 0.0, time.monotonic()
        self.release(ws)
        # A process that release() started (Reach's dispatcher) counts from the end of its
        # start-up, which is when release() returns.
        cpu_start = cpu0
        cpu0 = {**ws.cpu(), **cpu0}
        self.wait_drained(n, ws)
        after = self.b.target.snapshot()
        cpu1 = ws.cpu()
        busy1, own1, t1 = machine_busy_seconds(), cpu_seconds(os.getpid()) or 0.0, time.monotonic()
        drain = self.drain_times(n, ws)
        worker_cpu = sum(cpu1[p.name] - cpu0[p.name] for p in ws.workers)
        helper_cpu = sum(cpu1[p.name] - cpu0[p.name] for p in ws.helpers)
        ours = sum(cpu1[name] - cpu_start.get(name, 0.0) for name in cpu1)
        ours += (after.cpu_s - before.cpu_s) + (own1 - own0)
        foreign = max(0.0, (busy1 - busy0) - ours) / max(t1 - t0, 1e-9) / (os.cpu_count() or 1)
        return {
            "rate": drain.rate,
            "seconds": drain.seconds,
            "clock": drain.clock,
            "redis": after.delta(before, n),
            "worker_cpu_us_per_task": round(worker_cpu * 1e6 / n, 1),
            "helper_cpu_us_per_task": round(helper_cpu * 1e6 / n, 1) if ws.helpers else None,
            "foreign_cpu_pct": round(100 * foreign, 1),
        }

    def run_rep(self, on_phase: Callable[[str], None]) -> dict[str, Any]:
        """Both phases once; the figures of this repetition."""
        s = self.b.sizes
        n = self.n
        out: dict[str, Any] = {"n": n}
        # Phase A: one at a time, one worker, round trips.
        self.begin()
        try:
            on_phase("enqueue one at a time")
            out["enqueue_one"] = n / self.enqueue(n, bulk=False)  # type: ignore[operator]
            ws = self.start_workers(1)
            try:
                on_phase("drain, 1 worker")
                out["drain_1"] = self.measured_drain(n, ws)
                on_phase("round trips")
                samples = self.round_trips(s.rt_n, ws)
                out["rt_p50_ms"] = percentile(samples, 50)
                out["rt_p99_ms"] = percentile(samples, 99)
                out["rt_mean_ms"] = sum(samples) / len(samples)
                out["worker_rss_kb"] = max((p.peak_rss_kb() or 0) for p in ws.workers)
            finally:
                self.stop_workers(ws)
        finally:
            self.cleanup()
        # Phase B: bulk, two workers.
        self.begin()
        try:
            on_phase("enqueue in bulk")
            seconds = self.enqueue(n, bulk=True)
            out["enqueue_many"] = n / seconds if seconds else None
            if seconds is None:  # no bulk API: the tasks still have to be queued
                self.enqueue(n, bulk=False)
            ws = self.start_workers(2)
            try:
                on_phase("drain, 2 workers")
                out["drain_2"] = self.measured_drain(n, ws)
                out["worker_rss_kb_2"] = max((p.peak_rss_kb() or 0) for p in ws.workers)
            finally:
                self.stop_workers(ws)
        finally:
            self.cleanup()
        return out


def ready_all(procs: list[Proc], timeout: float = 60.0) -> None:
    """Wait for READY from each of our launchers."""
    for proc in procs:
        proc.wait_line("READY", timeout)


def go_all(procs: list[Proc]) -> None:
    for proc in procs:
        proc.send("GO")


def stats_all(procs: list[Proc], timeout: float = 30.0) -> list[dict[str, Any]]:
    """Ask each launcher for its STATS line (and reset its counters)."""
    import json

    for proc in procs:
        proc.send("REPORT")
    return [json.loads(proc.wait_line("STATS", timeout)) for proc in procs]


def launcher_drain(procs: list[Proc], n: int, clock: str) -> Drain:
    """A drain's span from the launchers' own first/last result-stored times."""
    # A launcher notes a batch just after Redis answered it, so the harness may see the last
    # result stored a moment before the launcher has counted it: ask again until all are in
    # (each REPORT hands over and resets the counts since the previous one).
    stats: list[dict[str, Any]] = []
    deadline = time.monotonic() + 10
    while True:
        stats += [s for s in stats_all(procs) if s.get("n")]
        counted = sum(int(s["n"]) for s in stats)
        if counted >= n:
            break
        if time.monotonic() > deadline:
            raise ProcessFailed(f"workers report {counted} of {n} results")
        time.sleep(0.05)
    return Drain(min(float(s["first_ms"]) for s in stats), max(float(s["last_ms"]) for s in stats),
                 n, clock)
