"""OpenTelemetry, when the process uses it (`pip install 'agent-reach[otel]'`).

Nothing here imports OpenTelemetry on its own. A process that traces has imported
`opentelemetry.trace` already (to configure its tracer provider or to start a span), so its
presence in sys.modules is the switch: without it a submit or an attempt pays one dict lookup,
and the task's trace context is plain W3C text (broker/protocol/trace.py). Spans are made only
once a tracer provider is set up (a library such as mcp loads the API without one).

The spans follow the messaging conventions: `send {capability}` (PRODUCER) around a submit,
whose context becomes the task's traceparent (broker/client/tracing.py), and
`process {capability}` (CONSUMER) for every attempt (agent_worker/tracing.py).
"""

from __future__ import annotations

import sys
import time
from types import ModuleType
from typing import Any

TRACER_NAME = "agent-reach"
MESSAGING_SYSTEM = "reach"


def loaded() -> ModuleType | None:
    """`opentelemetry.trace` when this process uses OpenTelemetry, else None."""
    return sys.modules.get("opentelemetry.trace")


_RECHECK_S = 1.0
_looked_at = -_RECHECK_S


def spans_on(otel: ModuleType) -> bool:
    """Whether a tracer provider is set up (until then the API's spans record nothing).

    Asked once per submit and per attempt, so it is cheap: a provider set in code is the API's
    module global, one lookup; without one, get_tracer_provider (which reads the environment
    for a provider named there) is asked again at most once a second."""
    global _looked_at
    if getattr(otel, "_TRACER_PROVIDER", None) is not None:
        return True
    now = time.monotonic()
    if now - _looked_at < _RECHECK_S:
        return False
    _looked_at = now
    return not isinstance(otel.get_tracer_provider(), otel.ProxyTracerProvider)


def tracer(otel: ModuleType) -> Any:
    return otel.get_tracer(TRACER_NAME)


def parent_context(traceparent: str, tracestate: str) -> Any:
    """An OpenTelemetry context whose (remote) parent is this W3C trace context."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier = {"traceparent": traceparent}
    if tracestate:
        carrier["tracestate"] = tracestate
    return TraceContextTextMapPropagator().extract(carrier)


def w3c_of(span: Any) -> tuple[str, str] | None:
    """(traceparent, tracestate) of the span's own context; None for an invalid span."""
    sc = span.get_span_context()
    if not sc.is_valid:
        return None
    return (f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{int(sc.trace_flags):02x}",
            sc.trace_state.to_header() if sc.trace_state else "")
