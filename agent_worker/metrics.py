"""A worker's metrics: what its agent does, labelled by capability and agent id (served by
broker/infra/metrics_server.py on its own thread, when the worker is given a metrics_addr).

The attempts feed the histograms and counters as they start and end (plain numbers the event
loop's thread keeps: well under a microsecond each); the scrape turns them into metrics, and
reads the gauges (in flight, slots, loop lag, state) from the worker. The agent's state is the
registry's, read from Redis at the scrape and judged as `reach agents` judges it, so the two
agree.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from broker.ids import local_id_ms
from broker.infra import connection
from broker.keys import RegistryKeys
from broker.models import Outcome
from broker.registry import AgentRecord, AgentState, agent_state, clock_of
from broker.settings import Settings

TASK_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                120.0, 300.0, 600.0)
"""Seconds, from a no-op handler to a long model call."""


@dataclass(frozen=True)
class WorkerView:
    """What the gauges read from the worker when scraped (each a call: values of the moment)."""

    inflight: Callable[[], dict[str, int]]
    """Running attempts by capability."""
    slots: Callable[[], int]
    held_slots: Callable[[], int]
    loop_lag_s: Callable[[], float]


class _Histogram:
    """Counts by bucket and a sum, kept by the event loop's thread alone (plain ints: an
    observation is a bisect and an add, a few times cheaper than prometheus-client's locked
    ones, on a path every task takes); the scrape reads them as they are."""

    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(TASK_BUCKETS) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(TASK_BUCKETS, value)] += 1
        self.sum += value

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative, as Prometheus has them (`le`, then `+Inf`: the count)."""
        out: list[tuple[str, float]] = []
        total = 0
        for bound, n in zip((*map(str, TASK_BUCKETS), "+Inf"), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out


class _Capability:
    __slots__ = ("outcomes", "task_seconds", "wait_seconds")

    def __init__(self) -> None:
        self.task_seconds = _Histogram()
        self.wait_seconds = _Histogram()
        self.outcomes = {o.value: 0 for o in Outcome}


class WorkerMetrics:
    def __init__(self, settings: Settings, agent_id: str, capabilities: list[str]) -> None:
        self.settings = settings
        self.agent_id = agent_id
        self.capabilities = capabilities
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        self._by_capability = {capability: _Capability() for capability in capabilities}
        self.state = AgentStateProbe(settings, agent_id)

    def started(self, capability: str, local_id: str) -> None:
        """An attempt started: how long its task waited since it was submitted."""
        wait_s = time.time() - local_id_ms(local_id) / 1000
        self._by_capability[capability].wait_seconds.observe(wait_s if wait_s > 0 else 0.0)

    def ended(self, capability: str, outcome: str, exec_ms: int) -> None:
        mine = self._by_capability[capability]
        mine.task_seconds.observe(exec_ms / 1000)
        mine.outcomes[outcome] += 1

    def watch(self, view: WorkerView) -> None:
        """Serve the metrics, with the gauges read from the worker."""
        self.registry.register(_Collector(self, view))

    def families(self) -> Iterator[Any]:
        """The histograms and counters as they stand."""
        labels = ["capability", "agent_id"]
        seconds = HistogramMetricFamily("reach_agent_task_seconds", "Execution time of attempts "
                                        "(the handler's call)", labels=labels)
        wait = HistogramMetricFamily("reach_agent_queue_wait_seconds", "From a task's submit to the "
                                     "start of its attempt here (backoffs and delays included)",
                                     labels=labels)
        tasks = CounterMetricFamily("reach_agent_tasks", "Attempts ended here, by outcome",
                                    labels=[*labels, "outcome"])
        for capability, mine in self._by_capability.items():
            seconds.add_metric([capability, self.agent_id], mine.task_seconds.buckets(),
                               mine.task_seconds.sum)
            wait.add_metric([capability, self.agent_id], mine.wait_seconds.buckets(),
                            mine.wait_seconds.sum)
            for outcome, n in mine.outcomes.items():
                tasks.add_metric([capability, self.agent_id, outcome], n)
        yield from (seconds, wait, tasks)


class AgentStateProbe:
    """The agent's state as the registry judges it (server clock), read on the calling thread
    with a client of its own; None when it cannot be read (Redis away, not registered)."""

    def __init__(self, settings: Settings, agent_id: str, timeout_s: float = 1.0) -> None:
        self.settings = settings
        self.agent_id = agent_id
        self.timeout_s = timeout_s
        self._client: Any = None
        self._lock = threading.Lock()

    def __call__(self) -> AgentState | None:
        keys = RegistryKeys(self.settings.prefix)
        with self._lock:
            try:
                if self._client is None:
                    self._client = connection.sync_client(self.settings, socket_timeout=self.timeout_s)
                data: Any = self._client.hgetall(keys.agent(self.agent_id))
                record = AgentRecord.from_hash(data) if data else None
                if record is None:
                    return None
                return agent_state(record, clock_of(self._client, keys.agents), self.settings)
            except Exception:  # (unknown now: the probe and the gauge say so)
                if self._client is not None:
                    self._client.close()
                    self._client = None
                return None


class _Collector(Collector):
    def __init__(self, metrics: WorkerMetrics, view: WorkerView) -> None:
        self.metrics = metrics
        self.view = view

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        yield from self.metrics.families()
        agent, view = self.metrics.agent_id, self.view
        inflight = GaugeMetricFamily("reach_agent_inflight_tasks", "Attempts running here",
                                     labels=["capability", "agent_id"])
        running = view.inflight()
        for capability in self.metrics.capabilities:
            inflight.add_metric([capability, agent], running.get(capability, 0))
        yield inflight
        for name, text, value in (
            ("reach_agent_slots", "Tasks this worker runs at once (its concurrency)", view.slots()),
            ("reach_agent_held_slots", "Slots held by handlers still running past their timeout",
             view.held_slots()),
            ("reach_agent_event_loop_lag_seconds", "How late the worker's event loop runs (recent "
             "maximum, decaying)", view.loop_lag_s()),
        ):
            family = GaugeMetricFamily(name, text, labels=["agent_id"])
            family.add_metric([agent], value)
            yield family
        state = self.metrics.state()
        family = GaugeMetricFamily("reach_agent_state", "1 for the agent's state as the registry "
                                   "judges it (all 0 while it cannot be read)", labels=["agent_id", "state"])
        for each in AgentState:
            family.add_metric([agent, each.value], 1 if each is state else 0)
        yield family
