"""Handlers the agent-protocol tests (A2A, MCP) run in real `reach-worker` processes."""

from __future__ import annotations

import asyncio

from pydantic import BaseModel, ConfigDict, Field

from agent_worker import InvalidRequest, TaskContext


class LongJob(BaseModel):
    """How long to work and what to end with."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"steps": 3, "step_ms": 10}]})

    steps: int = Field(0, ge=0, le=1000, description="progress events to send")
    step_ms: int = Field(0, ge=0, le=60_000, description="pause before each progress event")
    fail: str | None = Field(None, description="fail with this error after the steps")
    invalid: str | None = Field(None, description="call the request invalid with this error")
    echo: str = ""


class LongResult(BaseModel):
    echo: str
    steps: int


async def long_job(ctx: TaskContext, payload: LongJob) -> LongResult:
    """A long task: `steps` progress events `step_ms` apart (the issue's 30 s job, with the duration a
    parameter), then the result, or the failure asked for."""
    for i in range(payload.steps):
        await asyncio.sleep(payload.step_ms / 1000)
        await ctx.progress((i + 1) / (payload.steps + 1), f"step {i + 1} of {payload.steps}", step=i + 1)
    if payload.invalid:
        raise InvalidRequest(payload.invalid)
    if payload.fail:
        raise RuntimeError(payload.fail)
    return LongResult(echo=payload.echo, steps=payload.steps)
