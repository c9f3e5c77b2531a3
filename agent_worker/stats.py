"""What a worker says about itself in its heartbeats (advisory: routing counts load from Redis).

- latency: the median execution time of the last 100 attempts (queueing excluded), and a
  baseline, the median of the last 1,000, against which "slower than usual" is judged;
- health: success rates over the last 1, 5 and 30 minutes weighted 0.6 / 0.3 / 0.1 (an
  invalid request is the request's fault, not the agent's, and counts as a success here);
- stability: health, reduced when the event loop lags (a sign of CPU starvation or a handler
  blocking the loop);
- loop progress age, in-flight count, RSS and its growth since start.

To keep a thousand agents from storming the registry, `changed()` tells the heartbeat whether
the numbers moved enough to be worth writing; otherwise a beat only renews liveness.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from typing import Any

WINDOWS_S = (60.0, 300.0, 1800.0)
WINDOW_WEIGHTS = (0.6, 0.3, 0.1)
FULL_STATS_EVERY_S = 30.0


def _median(values: list[int]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return float(ordered[len(ordered) // 2])


class WorkerStats:
    """Counters the event loop updates and the heartbeat thread reads (under one lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.done = 0
        self.succeeded = 0
        self.failed = 0
        self.rejected = 0
        self._recent_ms: deque[int] = deque(maxlen=100)
        self._baseline_ms: deque[int] = deque(maxlen=1000)
        # Per-second buckets [second, ok, total] over the longest window.
        self._buckets: deque[list[int]] = deque()

    def record(self, exec_ms: int, agent_ok: bool) -> None:
        second = int(time.monotonic())
        with self._lock:
            self._recent_ms.append(exec_ms)
            self._baseline_ms.append(exec_ms)
            if not self._buckets or self._buckets[-1][0] != second:
                self._buckets.append([second, 0, 0])
                while self._buckets and second - self._buckets[0][0] > WINDOWS_S[-1]:
                    self._buckets.popleft()
            bucket = self._buckets[-1]
            bucket[1] += int(agent_ok)
            bucket[2] += 1

    def latency_p50_ms(self) -> float | None:
        with self._lock:
            return _median(list(self._recent_ms))

    def latency_baseline_ms(self) -> float | None:
        with self._lock:
            return _median(list(self._baseline_ms))

    def success_rates(self, now: float | None = None) -> list[float | None]:
        now = time.monotonic() if now is None else now
        with self._lock:
            buckets = [tuple(b) for b in self._buckets]
        rates: list[float | None] = []
        for window in WINDOWS_S:
            ok = total = 0
            for second, good, seen in buckets:
                if now - second <= window:
                    ok += good
                    total += seen
            rates.append(ok / total if total else None)
        return rates

    def health(self, now: float | None = None) -> float:
        """0.6 x 1-minute + 0.3 x 5-minute + 0.1 x 30-minute success rate (no data: 1.0)."""
        rates = self.success_rates(now)
        weighted = (w * (1.0 if r is None else r) for w, r in zip(WINDOW_WEIGHTS, rates, strict=True))
        return round(sum(weighted), 4)


def stability(health: float, loop_lag_ms: float) -> float:
    """Health, halved at worst as the event loop lag grows from 50 ms to 1 s."""
    lag_penalty = min(max((loop_lag_ms - 50.0) / 950.0, 0.0), 1.0) * 0.5
    return round(health * (1.0 - lag_penalty), 4)


def changed(previous: dict[str, Any], current: dict[str, Any]) -> bool:
    """Whether the numbers moved enough to be written to the registry."""
    if not previous:
        return True
    for key in ("draining", "stalled"):
        if previous.get(key) != current.get(key):
            return True
    for key, rel in (("latency_p50_ms", 0.2), ("latency_baseline_ms", 0.2)):
        a, b = previous.get(key), current.get(key)
        if (a is None) != (b is None):
            return True
        if a is not None and b is not None and abs(a - b) > rel * max(a, b, 1.0):
            return True
    for key, absolute in (("health", 0.02), ("stability", 0.05)):
        if abs((previous.get(key) or 0.0) - (current.get(key) or 0.0)) > absolute:
            return True
    return False


def rss_kb() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") // 1024
    except (OSError, ValueError, IndexError):
        return None
