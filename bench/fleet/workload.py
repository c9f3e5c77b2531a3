"""The workload every system gets: the same seeded task durations at the same steady rate.

Durations look like LLM calls scaled down: lognormal with a median of 40 ms and a p99 near
400 ms (sigma = ln(10) / z(0.99)), drawn from one seed so every system and scenario runs the
very same tasks. The producer is open-loop: task i is due at `i / rate` seconds after the start,
whether or not earlier tasks finished, at `load` (70 %) of what the fleet can do.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

Z99 = 2.3263478740408408
"""The standard normal's 99th percentile."""


@dataclass(frozen=True)
class Workload:
    n: int = 5000
    agents: int = 8
    concurrency: int = 4
    median_ms: float = 40.0
    p99_ms: float = 400.0
    load: float = 0.70
    seed: int = 29

    @property
    def sigma(self) -> float:
        return math.log(self.p99_ms / self.median_ms) / Z99

    @property
    def mean_ms(self) -> float:
        """The lognormal's mean: median x exp(sigma^2 / 2) (about 65 ms)."""
        return self.median_ms * math.exp(self.sigma ** 2 / 2)

    @property
    def capacity(self) -> float:
        """Tasks per second the whole healthy fleet can finish."""
        return self.agents * self.concurrency * 1000 / self.mean_ms

    @property
    def rate(self) -> float:
        """Tasks per second the producer offers."""
        return self.load * self.capacity

    @property
    def seconds(self) -> float:
        """How long the producer submits."""
        return self.n / self.rate

    def at(self, share: float) -> float:
        """Seconds after the start at which `share` of the tasks has been submitted."""
        return share * self.seconds

    def durations(self) -> list[float]:
        """Each task's duration in whole ms (at least 1), the same for every system.

        Whole, because the agents' timers differ on fractions: Node's setTimeout truncates the
        delay (a BullMQ agent slept 0.21 ms less than asked, on average) while uvloop rounds it
        up (a Reach agent 0.24 ms more), a 0.45 ms head start per task for one system; on whole
        ms both overshoot alike (0.36 and 0.24 ms, see docs/fleet-benchmark.md)."""
        rng = random.Random(self.seed)
        mu = math.log(self.median_ms)
        return [float(max(1, round(rng.lognormvariate(mu, self.sigma)))) for _ in range(self.n)]

    def describe(self) -> dict[str, Any]:
        return {**asdict(self), "sigma": round(self.sigma, 4), "mean_ms": round(self.mean_ms, 1),
                "capacity_per_s": round(self.capacity, 1), "rate_per_s": round(self.rate, 1),
                "submit_seconds": round(self.seconds, 2)}


def write_plan(path: Path, workload: Workload) -> None:
    """The file a producer reads: the rate and every task's duration."""
    path.write_text(json.dumps({"rate": workload.rate, "durations": workload.durations()}))


def read_plan(path: str | Path) -> tuple[float, list[float]]:
    plan = json.loads(Path(path).read_text())
    return float(plan["rate"]), [float(d) for d in plan["durations"]]
