"""The worker runtime: `reach-worker`, the handler contract, the HTTP bridge, built-in agents.

    from agent_worker import TaskContext, InvalidRequest, Retryable

    async def handle(ctx: TaskContext, payload: dict) -> dict:
        await ctx.progress(0.5, "half way")
        return {"summary": "..."}
"""

from agent_worker.binding import Binding
from agent_worker.context import TaskContext
from agent_worker.errors import InvalidRequest, Retryable
from agent_worker.handlers import load_handler, resolve_bindings
from agent_worker.worker import Worker

__all__ = ["Binding", "InvalidRequest", "Retryable", "TaskContext", "Worker", "load_handler",
           "resolve_bindings"]
