"""The fleet's numbers as Prometheus metrics, read from Redis when scraped: what `reach queues`
and `reach agents` show (overview.py), every capability's counters (broker/protocol/counters.py)
and its policy. Any process that reads them reports the whole fleet's numbers, so two
dispatchers agree; nothing is counted in the process.

Read on the scraping thread with a client of its own (short timeouts): a scrape never touches
the event loop. With Redis away, a scrape reports `reach_redis_up 0` and nothing else of the
fleet's.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from broker.errors import BrokerUnavailable
from broker.infra import connection, outages
from broker.keys import CapabilityKeys
from broker.ops import overview, policy
from broker.policy import Policy
from broker.protocol.counters import Counters, parse_counters
from broker.registry import AgentState
from broker.settings import Settings

log = logging.getLogger("reach.metrics")

SCRAPE_TIMEOUT_S = 2.0

QUEUE_GAUGES = (
    ("reach_queue_depth", "queued", "Tasks waiting in the ready queue (and raw intake entries)"),
    ("reach_delayed_tasks", "delayed", "Tasks waiting for a retry's backoff or their start time"),
    ("reach_inbox_unread_tasks", "unread_in_inboxes", "Tasks in agents' inboxes not read yet"),
    ("reach_running_tasks", "running", "Tasks read by their agent and not finished"),
    ("reach_dead_letters", "dead_letters", "Entries in the dead-letter stream"),
)
COUNTERS = (
    ("reach_tasks_submitted", "submitted", "Tasks created by submits"),
    ("reach_task_retries", "retries", "Retries scheduled after a retryable failure"),
    ("reach_task_reclaims", "reclaims",
     "Tasks taken back from an agent (lease lapsed, agent offline or draining, agent restarted)"),
    ("reach_task_reroutes", "reroutes", "Tasks routed past an agent whose inbox was full"),
    ("reach_late_results_rejected", "late_results", "Reports of superseded attempts refused"),
)
POLICY_GAUGES = (
    # (metric, field, factor to base units, help)
    ("reach_policy_max_attempts", "max_attempts", 1, "Attempts in all before a task fails"),
    ("reach_policy_timeout_seconds", "timeout_ms", 0.001, "Default execution timeout of an attempt"),
    ("reach_policy_aging_seconds", "aging_ms", 0.001, "A waiting task gains a priority level per this"),
    ("reach_policy_max_queue_depth", "max_queue_depth", 1, "Submits beyond this depth are refused"),
    ("reach_policy_retry_failures", "retry_failures", 1, "1: unclassified handler errors are retried"),
    ("reach_policy_no_agent_timeout_seconds", "no_agent_timeout_ms", 0.001,
     "A task no agent started within this fails (0: never)"),
    ("reach_policy_rate", "rate", 1, "Most task starts per second (0: no limit)"),
    ("reach_policy_burst", "burst", 1, "Starts the rate allows at once (0: one second's worth)"),
    ("reach_policy_max_running", "max_running", 1, "Most tasks handed out at once (0: no cap)"),
    ("reach_policy_paused", "paused", 1, "1 while the capability is paused"),
)
_UNAVAILABLE: tuple[type[BaseException], ...] = (*outages.TRANSIENT_ERRORS, BrokerUnavailable)
STATES = tuple(state.value for state in AgentState)
DISPATCH_PATHS = ("routed", "direct", "pulled")


class FleetCollector(Collector):
    """A prometheus-client collector reading the fleet's numbers from Redis at each scrape."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._client: Any = None
        self._lock = threading.Lock()  # (one scrape at a time shares the client)

    def describe(self) -> list[Any]:
        return []  # (the names depend on what Redis holds; nothing to check at registration)

    def collect(self) -> Iterator[Any]:
        up = GaugeMetricFamily("reach_redis_up", "1 when the last scrape could read Redis")
        with self._lock:
            try:
                families = self._read()
            except _UNAVAILABLE as exc:
                log.warning("fleet metrics not read: Redis unavailable (%s)", exc)
                self._reset()
                up.add_metric([], 0)
                yield up
                return
        up.add_metric([], 1)
        yield up
        yield from families

    def _reset(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _read(self) -> list[Any]:
        if self._client is None:
            self._client = connection.sync_client(self.settings, socket_timeout=SCRAPE_TIMEOUT_S)
        client, settings = self._client, self.settings
        queues = overview.queue_rows(client, settings)
        agents = overview.agent_rows(client, settings)
        pipe = client.pipeline(transaction=False)
        for row in queues:
            pipe.hgetall(CapabilityKeys(settings.prefix, row.capability).stats)
        raws = pipe.execute() if queues else []
        counters = {row.capability: parse_counters(raw) for row, raw in zip(queues, raws, strict=True)}
        policies = {row.capability: policy.read(client, settings, row.capability) for row in queues}
        families = _queue_families(queues)
        families.append(_agent_family(queues, agents))
        families += _counter_families(counters)
        families += _policy_families(policies)
        return families


def _queue_families(queues: list[overview.QueueRow]) -> list[Any]:
    out = []
    for name, attr, text in QUEUE_GAUGES:
        family = GaugeMetricFamily(name, text, labels=["capability"])
        for row in queues:
            family.add_metric([row.capability], getattr(row, attr))
        out.append(family)
    oldest = GaugeMetricFamily("reach_oldest_queued_age_seconds",
                               "How long the task at the queue's front has waited (0: none waits)",
                               labels=["capability"])
    for row in queues:
        oldest.add_metric([row.capability], row.oldest_queued_age_s or 0.0)
    out.append(oldest)
    return out


def _agent_family(queues: list[overview.QueueRow], agents: list[overview.AgentRow]) -> Any:
    """Agents by capability and state, as `reach agents` judges them (every state, 0s too)."""
    counts = {(row.capability, state): 0 for row in queues for state in STATES}
    for agent in agents:
        for capability in agent.capabilities:
            counts[(capability, agent.state)] = counts.get((capability, agent.state), 0) + 1
    family = GaugeMetricFamily("reach_agents", "Registered agents by capability and state",
                               labels=["capability", "state"])
    for (capability, state), n in sorted(counts.items()):
        family.add_metric([capability, state], n)
    return family


def _counter_families(counters: dict[str, Counters]) -> list[Any]:
    out = []
    for name, attr, text in COUNTERS:
        family = CounterMetricFamily(name, text, labels=["capability"])
        for capability, c in counters.items():
            family.add_metric([capability], getattr(c, attr))
        out.append(family)
    dispatched = CounterMetricFamily("reach_tasks_dispatched", "Tasks put in an agent's inbox, by "
                                     "how (a dispatcher's round, a submit's grant, an agent's pull)",
                                     labels=["capability", "path"])
    finished = CounterMetricFamily("reach_tasks_finished", "Tasks that ended, by outcome and reason",
                                   labels=["capability", "outcome", "reason"])
    for capability, c in counters.items():
        for path in DISPATCH_PATHS:
            dispatched.add_metric([capability, path], getattr(c, path))
        for (outcome, reason), n in sorted(c.finished.items()):
            finished.add_metric([capability, outcome, reason], n)
    return [*out, dispatched, finished]


def _policy_families(policies: dict[str, Policy]) -> list[Any]:
    out = []
    for name, field, factor, text in POLICY_GAUGES:
        family = GaugeMetricFamily(name, text, labels=["capability"])
        for capability, p in policies.items():
            family.add_metric([capability], float(p[field]) * factor)
        out.append(family)
    return out
