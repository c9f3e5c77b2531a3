"""TaskContext: what a handler knows about the task it runs, and how it talks back."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

ProgressSink = Callable[["TaskContext", float | None, str | None, dict[str, Any]], Awaitable[bool]]


class _Done:
    """An already-finished awaitable, returned when a sync handler reports progress."""

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield  # pragma: no cover - makes this a generator


@dataclass(eq=False)
class TaskContext:
    task_id: str
    capability: str
    attempt: int
    max_attempts: int
    trace_id: str
    """The W3C trace id (32 hex) of the task's trace."""
    session_id: str | None
    deadline: datetime | None
    """When the whole task must have ended (from the producer's deadline_s), if any."""
    timeout_s: float
    """This attempt's execution timeout."""
    metadata: dict[str, Any] = field(default_factory=dict)
    traceparent: str = ""
    """The W3C traceparent this attempt runs under: its `process` span's with OpenTelemetry
    tracing on (so a downstream call is that span's child), else the task's. Send it (and
    `tracestate`) on to whatever the handler calls."""
    tracestate: str = ""
    _sink: ProgressSink | None = field(default=None, repr=False)
    _loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False)
    _cancelled: bool = field(default=False, repr=False)
    _timed_out: bool = field(default=False, repr=False)
    """Set by the worker when the attempt ran past its execution timeout."""

    @property
    def cancelled(self) -> bool:
        """True once the task was canceled or this attempt was superseded; stop early then."""
        return self._cancelled

    def progress(self, fraction: float | None = None, message: str | None = None,
                 **data: Any) -> Awaitable[None]:
        """Report progress (fraction 0..1, a message, any JSON fields).

        `await ctx.progress(0.5, "half way")` in async handlers; sync handlers just call it.
        A report over max_progress_message_bytes, or nested deeper than max_json_depth, raises
        PayloadTooLarge or NestedTooDeep (both ValueErrors) and is not recorded; a task keeps
        its latest max_progress_events reports.
        """
        if fraction is not None and not 0.0 <= fraction <= 1.0:
            raise ValueError(f"progress fraction must be between 0 and 1, got {fraction!r}")
        coro = self._report(fraction, message, data)
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # called from a sync handler's thread
            if self._loop is None:
                coro.close()
                return _Done()
            asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)
            return _Done()
        return coro

    async def _report(self, fraction: float | None, message: str | None, data: dict[str, Any]) -> None:
        if self._sink is None:
            return
        still_current = await self._sink(self, fraction, message, data)
        if not still_current:
            self._cancelled = True

    def _cancel(self) -> None:
        self._cancelled = True
