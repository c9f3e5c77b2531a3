"""Handlers for the trace-context tests, run inside real `reach-worker` processes.

Each records what its TaskContext said about the trace (one JSON line per attempt, in Redis
under the test's prefix). With REACH_TEST_SPANS set, importing this module sets up the
OpenTelemetry SDK in the worker, exporting every finished span to that file as a JSON line
(tests/otel_spans.py), and the handlers start spans of their own.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from agent_worker import Retryable, TaskContext
from tests.handlers import _redis

if os.environ.get("REACH_TEST_SPANS"):
    from tests.otel_spans import install_file_exporter

    install_file_exporter(os.environ["REACH_TEST_SPANS"])


def _seen_key() -> str:
    return f"{os.environ['REACH_PREFIX']}:test:trace"


def seen(client: Any, prefix: str) -> list[dict[str, Any]]:
    """What each attempt's context said, in the order they ran."""
    return [json.loads(line) for line in client.lrange(f"{prefix}:test:trace", 0, -1)]


def _record(ctx: TaskContext) -> dict[str, Any]:
    about = {"task_id": ctx.task_id, "attempt": ctx.attempt, "trace_id": ctx.trace_id,
             "traceparent": ctx.traceparent, "tracestate": ctx.tracestate}
    _redis().rpush(_seen_key(), json.dumps(about))
    return about


def _own_span(name: str) -> Any:
    """A span of the handler's own (only with OpenTelemetry set up in this worker)."""
    if not os.environ.get("REACH_TEST_SPANS"):
        return None
    from opentelemetry import trace

    return trace.get_tracer("tests.trace_handlers").start_as_current_span(name)


async def echo(ctx: TaskContext, payload: Any) -> Any:
    """Async: records its context, in a span of its own; fails the first attempt when asked,
    or hangs in it (for a test to kill the worker)."""
    if isinstance(payload, dict) and payload.get("hang_first") and ctx.attempt == 1:
        _record(ctx)
        await asyncio.sleep(600)
    span = _own_span("handler async")
    if span is None:
        return _work(ctx, payload)
    with span:
        return _work(ctx, payload)


def echo_sync(ctx: TaskContext, payload: Any) -> Any:
    """The same, run in a handler thread."""
    span = _own_span("handler sync")
    if span is None:
        return _work(ctx, payload)
    with span:
        return _work(ctx, payload)


def _work(ctx: TaskContext, payload: Any) -> Any:
    about = _record(ctx)
    if isinstance(payload, dict) and payload.get("fail_first") and ctx.attempt == 1:
        raise Retryable("first attempt fails on purpose")
    if isinstance(payload, dict) and payload.get("fail"):
        raise RuntimeError("fails on purpose")
    return about
