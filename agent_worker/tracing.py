"""The `process {capability}` span (CONSUMER) of every attempt, when the worker's process uses
OpenTelemetry (broker/infra/otel.py: a handler module or `opentelemetry-instrument` set up a
tracer provider).

The span is a child of the task's traceparent (the producer's `send` span), carries the
messaging attributes, reach.attempt and reach.agent_id, and its status is the attempt's outcome.
Its events come from what the attempt's delivery already says, at no Redis cost: `dispatch` at
the time the task entered this agent's inbox (the entry id's time), `retry` for any attempt after
the first, and `reclaim` when an earlier delivery was taken back from its agent (its fence ran
ahead of the attempts: a lapsed lease reclaimed, or an unread entry rerouted). It is the current
span while the handler runs, so the handler's own spans (in a sync handler's thread too) are
its children.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from broker.infra import otel as otel_api
from broker.models import Outcome
from broker.protocol.delivery import AcceptedTask
from broker.protocol.trace import TraceContext

MAX_STATUS_TEXT = 256


@dataclass(slots=True)
class AttemptSpan:
    otel: ModuleType
    span: Any
    trace: TraceContext
    """The span's own context (the task's when the span records nothing)."""

    def run_context(self) -> contextvars.Context:
        """A copy of the current context with the span current, for the attempt's task."""
        from opentelemetry import context

        run = contextvars.copy_context()
        run.run(context.attach, self.otel.set_span_in_context(self.span))
        return run

    def end(self, outcome: Outcome, body: str) -> None:
        from opentelemetry.trace import Status, StatusCode

        self.span.set_attribute("reach.outcome", outcome.value)
        if outcome is Outcome.SUCCESS:
            self.span.set_status(Status(StatusCode.OK))
        else:
            self.span.set_attribute("error.type", outcome.value)
            self.span.set_status(Status(StatusCode.ERROR, f"{outcome.value}: {body[:MAX_STATUS_TEXT]}"))
        self.span.end()


def _entry_ns(entry_id: str) -> int | None:
    """When an inbox entry was added (server clock, ns), from its stream id."""
    ms = entry_id.partition("-")[0]
    return int(ms) * 1_000_000 if ms.isdigit() else None


def start_process_span(otel: ModuleType, capability: str, agent_id: str, task: AcceptedTask,
                       trace: TraceContext) -> AttemptSpan:
    attempt = task.attempt
    span = otel_api.tracer(otel).start_span(
        f"process {capability}", context=otel_api.parent_context(trace.traceparent, trace.tracestate),
        kind=otel.SpanKind.CONSUMER, attributes={
            "messaging.system": otel_api.MESSAGING_SYSTEM, "messaging.destination.name": capability,
            "messaging.operation.type": "process", "messaging.operation.name": "process",
            "messaging.message.id": task.task_id, "reach.attempt": attempt, "reach.agent_id": agent_id,
        })
    dispatched = _entry_ns(task.entry_id)
    span.add_event("dispatch", {"reach.agent_id": agent_id}, timestamp=dispatched)
    if attempt > 1:
        fence = int(task.fence) if task.fence.isdigit() else 0
        if fence > attempt:
            span.add_event("reclaim", {"reach.redeliveries": fence - attempt})
        span.add_event("retry", {"reach.attempt": attempt})
    own = otel_api.w3c_of(span)
    return AttemptSpan(otel, span, TraceContext(*own) if own is not None else trace)
