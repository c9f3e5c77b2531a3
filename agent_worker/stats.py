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
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

WINDOWS_S = (60.0, 300.0, 1800.0)
WINDOW_WEIGHTS = (0.6, 0.3, 0.1)
FULL_STATS_EVERY_S = 30.0


def _median(values: list[int]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return float(ordered[len(ordered) // 2])


@dataclass
class WorkerStats:
    done: int = 0
    succeeded: int = 0
    failed: int = 0
    rejected: int = 0
    recent_ms: deque[int] = field(default_factory=lambda: deque(maxlen=100))
    baseline_ms: deque[int] = field(default_factory=lambda: deque(maxlen=1000))
    outcomes: deque[tuple[float, bool]] = field(default_factory=lambda: deque(maxlen=20000))
    _last_sent: dict[str, Any] = field(default_factory=dict)
    _last_sent_at: float = 0.0

    def record(self, exec_ms: int, agent_ok: bool) -> None:
        self.recent_ms.append(exec_ms)
        self.baseline_ms.append(exec_ms)
        self.outcomes.append((time.monotonic(), agent_ok))

    def latency_p50_ms(self) -> float | None:
        return _median(list(self.recent_ms))

    def latency_baseline_ms(self) -> float | None:
        return _median(list(self.baseline_ms))

    def success_rates(self, now: float | None = None) -> list[float | None]:
        now = time.monotonic() if now is None else now
        rates: list[float | None] = []
        for window in WINDOWS_S:
            seen = [ok for at, ok in self.outcomes if now - at <= window]
            rates.append(sum(seen) / len(seen) if seen else None)
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
