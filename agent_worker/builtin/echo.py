"""`echo`: returns its payload unchanged. The no-op agent for smoke tests and benchmarks."""

from __future__ import annotations

from typing import Any

from agent_worker.context import TaskContext


async def handle(ctx: TaskContext, payload: Any) -> Any:
    return payload
