"""The OpenTelemetry SDK set up for the tracing tests: finished spans as plain dicts, written to
a file (a worker process) or kept in memory while a test records (the test process).

Only tests that import this module load OpenTelemetry (they skip without the `otel` extra).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult


def span_dict(span: ReadableSpan) -> dict[str, Any]:
    ctx = span.get_span_context()
    assert ctx is not None
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent_id": f"{span.parent.span_id:016x}" if span.parent is not None else None,
        "attributes": dict(span.attributes or {}),
        "status": span.status.status_code.name,
        "status_text": span.status.description,
        "events": [{"name": e.name, "attributes": dict(e.attributes or {}), "time_ns": e.timestamp}
                   for e in span.events],
        "start_ns": span.start_time,
    }


class FileExporter(SpanExporter):
    """One JSON line per finished span, appended to `path`."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(span_dict(s)) + "\n" for s in spans)
        with self._lock, self.path.open("a") as out:
            out.write(lines)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def install_file_exporter(path: str) -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileExporter(path)))
    trace.set_tracer_provider(provider)


def read_spans(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class Recorder(SpanExporter):
    """Keeps the spans that end while a test records; drops the rest (the provider is the
    process's for good: other tests' submits make spans too)."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.recording = False
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self.recording:
            with self._lock:
                self.spans += [span_dict(s) for s in spans]
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


_recorder: Recorder | None = None


def recorder() -> Recorder:
    """The test process's recorder (its tracer provider is set the first time)."""
    global _recorder
    if _recorder is None:
        _recorder = Recorder()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_recorder))
        trace.set_tracer_provider(provider)
    return _recorder
