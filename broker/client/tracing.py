"""The `send {capability}` span (PRODUCER) around a submit, when the process uses OpenTelemetry
(broker/infra/otel.py): its context becomes the tasks' traceparent."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any

from broker.infra import otel as otel_api
from broker.protocol.submit import SubmitOptions
from broker.protocol.trace import given_trace


@dataclass(slots=True)
class SendSpan:
    span: Any
    """None when no tracer provider is set up."""
    options: SubmitOptions
    """The submit options with the span's trace context as the tasks' traceparent."""

    def sent(self, task_ids: Sequence[str]) -> None:
        if self.span is not None and len(task_ids) == 1:
            self.span.set_attribute("messaging.message.id", task_ids[0])


@contextmanager
def send_span(otel: ModuleType, capability: str, options: SubmitOptions,
              count: int = 1) -> Iterator[SendSpan]:
    """The span around a submit of `count` tasks: a child of the traceparent `options` gives
    (checked first: BadInput before any span starts), else of the current span. Without a
    tracer provider there is no span: the tasks join the current span's trace, if any."""
    given = given_trace(options.traceparent, options.tracestate, options.trace_id)
    if not otel_api.spans_on(otel):
        current = None if given is not None else otel_api.w3c_of(otel.get_current_span())
        if current is not None:
            options = replace(options, traceparent=current[0], tracestate=current[1] or None)
        yield SendSpan(None, options)
        return
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
