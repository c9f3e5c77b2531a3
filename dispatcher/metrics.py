"""A dispatcher's metrics and probes: the fleet's numbers read from Redis at each scrape
(broker/ops/fleet_metrics.py, the same for every dispatcher), and its own routing: decisions
made and how long its rounds take. Served by broker/infra/metrics_server.py on its own thread.
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector

from broker.infra.metrics_server import RedisProbe
from broker.ops.fleet_metrics import FleetCollector
from broker.settings import Settings

ROUND_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
TICK_S = 0.5
"""How often the event loop notes that it runs (/healthz reads how long ago it last did)."""


class CapabilityMetrics:
    """One capability loop's share (the label bound once: an observation is a call)."""

    def __init__(self, decisions: Any, round_seconds: Any) -> None:
        self.decisions = decisions
        self.round_seconds = round_seconds


class DispatcherMetrics:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        self.registry.register(FleetCollector(settings))
        self._decisions = Counter("reach_routing_decisions", "Tasks this dispatcher's rounds chose "
                                  "an agent for", ["capability"], registry=self.registry)
        self._round_seconds = Histogram("reach_routing_round_seconds", "Wall time of this "
                                        "dispatcher's routing rounds, their Redis calls included",
                                        ["capability"], buckets=ROUND_BUCKETS, registry=self.registry)
        self.redis_ok = RedisProbe(settings)
        self.last_tick = time.monotonic()

    def for_capability(self, capability: str) -> CapabilityMetrics:
        return CapabilityMetrics(self._decisions.labels(capability),
                                 self._round_seconds.labels(capability))

    def loop_age_s(self) -> float:
        return time.monotonic() - self.last_tick
