"""A worker's metrics: what its agent does, labelled by capability and agent id (served by
broker/infra/metrics_server.py on its own thread, when the worker is given a metrics_addr).

The attempts feed the histograms and counters as they start and end (an observation is about
a microsecond; the labels are bound once); the gauges (in flight, slots, loop lag, state) are
read from the worker when scraped. The agent's state is the registry's, read from Redis at the
scrape and judged as `reach agents` judges it, so the two agree.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector
from prometheus_client.core import GaugeMetricFamily
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


class WorkerMetrics:
    def __init__(self, settings: Settings, agent_id: str, capabilities: list[str]) -> None:
        self.settings = settings
        self.agent_id = agent_id
        self.capabilities = capabilities
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        labels = ["capability", "agent_id"]
        seconds = Histogram("reach_agent_task_seconds", "Execution time of attempts (the handler's "
                            "call)", labels, buckets=TASK_BUCKETS, registry=self.registry)
        wait = Histogram("reach_agent_queue_wait_seconds", "From a task's submit to the start of "
                         "its attempt here (backoffs and delays included)", labels,
                         buckets=TASK_BUCKETS, registry=self.registry)
        tasks = Counter("reach_agent_tasks", "Attempts ended here, by outcome", [*labels, "outcome"],
                        registry=self.registry)
        self._bound = {
            capability: (seconds.labels(capability, agent_id), wait.labels(capability, agent_id),
                         {o.value: tasks.labels(capability, agent_id, o.value) for o in Outcome})
            for capability in capabilities}
        self.state = AgentStateProbe(settings, agent_id)

    def started(self, capability: str, local_id: str) -> None:
        """An attempt started: how long its task waited since it was submitted."""
        wait_s = time.time() - local_id_ms(local_id) / 1000
        self._bound[capability][1].observe(wait_s if wait_s > 0 else 0.0)

    def ended(self, capability: str, outcome: str, exec_ms: int) -> None:
        seconds, _, outcomes = self._bound[capability]
        seconds.observe(exec_ms / 1000)
        outcomes[outcome].inc()

    def watch(self, view: WorkerView) -> None:
        """Serve the gauges read from the worker."""
        self.registry.register(_Gauges(self, view))


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


class _Gauges(Collector):
    def __init__(self, metrics: WorkerMetrics, view: WorkerView) -> None:
        self.metrics = metrics
        self.view = view

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
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
