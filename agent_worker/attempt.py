"""One attempt of a task running in this worker: its handler call and the lease it runs under."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from agent_worker.binding import Binding
from agent_worker.context import TaskContext
from agent_worker.tracing import AttemptSpan
from broker.infra import logs
from broker.protocol.delivery import Lease

STOP_WAIT_S = 5.0
"""How long a task told to stop (past its execution timeout, or at the end of a drain's
grace) may go on before it is given up: reported as stopped and its lease no longer renewed. A
handler that swallows the cancellation, or a blocking call in a thread, cannot be stopped from
outside; giving it up keeps the task from staying `running` for good."""


@dataclass(eq=False)
class Attempt:
    binding: Binding
    lease: Lease
    ctx: TaskContext
    task: asyncio.Task[Any] | None = None
    deadline: float = 0.0
    """When its execution timeout ends (event loop clock)."""
    started_at: float = 0.0
    """When it started (event loop clock)."""
    abandoned: bool = False
    """Told to stop and still running STOP_WAIT_S later: reported, its lease left to lapse."""
    span: AttemptSpan | None = None
    """Its OpenTelemetry `process` span, when the process traces (agent_worker/tracing.py)."""

    @property
    def capability(self) -> str:
        return self.binding.capability

    @property
    def task_id(self) -> str:
        return self.ctx.task_id

    def cancel(self) -> None:
        """Tell it to stop: its task was canceled, expired or handed on (its report would be
        refused). An async handler is cancelled; a sync one sees ctx.cancelled."""
        self.ctx._cancel()
        if self.binding.is_async and self.task is not None:
            self.task.cancel()


def about(attempt: Attempt) -> dict[str, Any]:
    """`extra=` for a log line about an attempt's task, outside the attempt's own context."""
    ctx = attempt.ctx
    return logs.task_extra(logs.task_fields(ctx.task_id, ctx.trace_id, ctx.capability, ctx.attempt))


class Running:
    """The attempts running in this process, by task id, and the inbox entries it started and
    has not reported yet (running, or ended and on their way): recovering its pending entries
    must never start those again."""

    def __init__(self) -> None:
        self.by_task: dict[str, Attempt] = {}
        self.unreported: set[str] = set()

    def __len__(self) -> int:
        return len(self.by_task)

    def attempts(self) -> list[Attempt]:
        return list(self.by_task.values())

    def get(self, task_id: str) -> Attempt | None:
        return self.by_task.get(task_id)

    def is_current(self, attempt: Attempt) -> bool:
        """Whether it is still the attempt running its task here (not ended, not given up)."""
        return self.by_task.get(attempt.task_id) is attempt

    def current(self, ctx: TaskContext) -> Attempt | None:
        """The attempt `ctx` belongs to while it runs its task here. (An attempt that outlived
        its timeout, reporting while the task's next attempt runs here, has none: its reports
        must not go out under that attempt's fence.)"""
        attempt = self.by_task.get(ctx.task_id)
        return attempt if attempt is not None and attempt.ctx is ctx else None
