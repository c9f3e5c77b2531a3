"""The `send {capability}` span (PRODUCER) around a submit, when the process has an
OpenTelemetry tracer provider set up (broker/infra/otel.py): its context becomes the tasks'
traceparent."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any

from broker.infra import otel as otel_api
from broker.protocol.submit import SubmitOptions
from broker.protocol.trace import given_trace


def producer_side(options: SubmitOptions) -> tuple[SubmitOptions, ModuleType | None]:
    """(the options, `opentelemetry.trace` when a send span is to wrap the submit).

    With OpenTelemetry loaded but no tracer provider (redis-py and mcp load the API on their
    own) there is no span: a task given no trace context joins the current span's, if any.
    """
    otel = otel_api.loaded()
    if otel is None:
        return options, None
    if otel_api.spans_on(otel):
        return options, otel
    if options.traceparent is None and options.trace_id is None:
        current = otel_api.w3c_of(otel.get_current_span())
        if current is not None:
            options = replace(options, traceparent=current[0], tracestate=current[1] or None)
    return options, None


@dataclass(slots=True)
class SendSpan:
    span: Any
    options: SubmitOptions
    """The submit options with the span's trace context as the tasks' traceparent."""

    def sent(self, task_ids: Sequence[str]) -> None:
        if len(task_ids) == 1:
            self.span.set_attribute("messaging.message.id", task_ids[0])


@contextmanager
def send_span(otel: ModuleType, capability: str, options: SubmitOptions,
              count: int = 1) -> Iterator[SendSpan]:
    """The span around a submit of `count` tasks: a child of the traceparent `options` gives
    (checked first: BadInput before any span starts), else of the current span."""
    given = given_trace(options.traceparent, options.tracestate, options.trace_id)
    attributes: dict[str, Any] = {
        "messaging.system": otel_api.MESSAGING_SYSTEM, "messaging.destination.name": capability,
        "messaging.operation.type": "send", "messaging.operation.name": "send"}
    if count != 1:
        attributes["messaging.batch.message_count"] = count
    parent = otel_api.parent_context(given.traceparent, given.tracestate) if given else None
    with otel_api.tracer(otel).start_as_current_span(
        f"send {capability}", context=parent, kind=otel.SpanKind.PRODUCER, attributes=attributes,
    ) as span:
        own = otel_api.w3c_of(span)
        if own is not None:
            options = replace(options, traceparent=own[0], tracestate=own[1] or None, trace_id=None)
        yield SendSpan(span, options)
