"""Answers that stream progress: `application/x-ndjson` (a JSON object a line) or
`text/event-stream` (a JSON object in each event's `data`). Lines with `progress` and/or
`message` become the task's progress events; the line with a business `status` is the outcome:

    {"progress": 0.4, "message": "read the document"}
    {"progress": 0.9, "message": "wrote the summary", "words": 120}
    {"status": "success", "result": {"summary": "..."}}
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx

from agent_worker.context import TaskContext
from agent_worker.errors import Retryable
from agent_worker.http_bridge.outcome import AgentFailed, business_outcome, is_business, parse_json
from broker.errors import InvalidPayload

log = logging.getLogger("reach.worker")

STREAM_TYPES = ("application/x-ndjson", "application/jsonl", "text/event-stream")
_PROGRESS_FIELDS = ("progress", "message")


def is_stream(response: httpx.Response) -> bool:
    kind = response.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    return 200 <= response.status_code < 300 and kind in STREAM_TYPES


async def _ndjson(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    async for line in lines:
        if line.strip():
            yield line


async def _sse_data(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    """Each SSE event's data (its `data:` lines joined), as the SSE format defines it."""
    data: list[str] = []
    async for line in lines:
        if not line:
            if data:
                yield "\n".join(data)
                data = []
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
    if data:
        yield "\n".join(data)


async def _bounded_lines(response: httpx.Response, limit: int) -> AsyncIterator[str]:
    """The answer's lines, refusing one longer than `limit` bytes."""
    pending = ""
    async for text in response.aiter_text():
        pending += text
        *complete, pending = pending.split("\n")
        for line in complete:
            yield line.rstrip("\r")
        if len(pending) > limit:
            raise AgentFailed(f"the agent streamed a line over {limit} bytes")
    if pending:
        yield pending.rstrip("\r")


async def read_stream(response: httpx.Response, ctx: TaskContext, limit: int) -> Any:
    """Report each progress line; return (or raise) what the outcome line says."""
    lines = _bounded_lines(response, limit)
    kind = response.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    messages = _sse_data(lines) if kind == "text/event-stream" else _ndjson(lines)
    n = 0
    async for text in messages:
        n += 1
        item = parse_json(text)
        if not isinstance(item, dict):
            raise AgentFailed(f"line {n} of the agent's stream is not a JSON object: {text[:100]!r}")
        if is_business(item):
            return business_outcome(item)
        if any(name in item for name in _PROGRESS_FIELDS):
            await report_progress(ctx, item)
    raise Retryable("the agent's stream ended without an outcome line (a line with a `status`)")


async def read_bounded(response: httpx.Response, limit: int) -> bytes:
    """A whole (not streamed) answer, refusing one over `limit` bytes."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > limit:
            raise AgentFailed(f"the agent's answer is over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def report_progress(ctx: TaskContext, item: dict[str, Any]) -> None:
    """A progress line (or a status answer's progress) as the task's progress event."""
    fraction = item.get("progress")
    if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0 <= fraction <= 1:
        fraction = None
    message = item.get("message")
    extra = {k: v for k, v in item.items() if k not in _PROGRESS_FIELDS}
    try:
        await ctx.progress(float(fraction) if fraction is not None else None,
                           str(message)[:1000] if message is not None else None, **extra)
    except InvalidPayload as exc:  # (over a limit: the agent's line is dropped, its task goes on)
        log.warning("progress of %s dropped: %s", ctx.task_id, exc)
