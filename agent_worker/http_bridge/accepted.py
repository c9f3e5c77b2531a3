"""Long tasks: an agent that answers 202 (`{"accepted": true, "status_url": "..."}`) has taken
the task and works on it after the reply. The attempt stays running here (its slot held, its
lease renewed, its execution timeout running) until the outcome arrives:

- by callback: the agent POSTs the outcome to the gateway (`POST /v1/callbacks/{task id}`, with
  the token the request carried in `X-Reach-Callback-Token`); the gateway keeps it and tells this
  worker on its control channel;
- by polling: when no callback came within `poll_after_s` (at once when no callback URL is
  configured), the worker GETs `status_url`, backing off from 1 s to 30 s (or as `Retry-After`
  says). 202 there means "still working" (its `progress`/`message` become progress events);
  anything else is the outcome, read as a synchronous answer is.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any

import httpx

from agent_worker.context import TaskContext
from agent_worker.http_bridge.options import POLL_FIRST_S, POLL_MAX_S
from agent_worker.http_bridge.outcome import AgentFailed, interpret, parse_json, retry_after_s
from agent_worker.http_bridge.stream import read_bounded, report_progress

if TYPE_CHECKING:
    from agent_worker.http_bridge.bridge import HttpBridge

RECHECK_S = 5.0
"""The callback is read again this often even without a message (one lost to a reconnect)."""


async def await_outcome(bridge: HttpBridge, ctx: TaskContext, fence: str, accepted: Any,
                        armed: bool, poll_after_s: float, body_limit: int) -> Any:
    """The outcome of a task the agent accepted (see the module's docstring)."""
    status_url = accepted.get("status_url") if isinstance(accepted, dict) else None
    if not isinstance(status_url, str) or not status_url.startswith(("http://", "https://")):
        status_url = None
    if status_url is None and not armed:
        raise AgentFailed("the agent accepted the task (202) without a status_url, and this worker "
                          "has no --http-callback-url for it to call back")
    waiter = bridge.waiter(ctx.task_id)
    poll_at = time.monotonic() + (poll_after_s if armed else 0.0)
    pause = POLL_FIRST_S
    try:
        while True:
            if armed and (text := await bridge.callback_outcome(ctx.task_id, fence)) is not None:
                return interpret(200, text.encode())
            now = time.monotonic()
            if status_url is not None and now >= poll_at:
                done, value, asked = await _poll(bridge, ctx, status_url, body_limit)
                if done:
                    return value
                poll_at = time.monotonic() + (asked if asked is not None else pause)
                pause = min(pause * 2, POLL_MAX_S)
            wait = RECHECK_S if status_url is None else max(0.0, poll_at - time.monotonic())
            waiter.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter.wait(), min(wait, RECHECK_S) if armed else wait)
    finally:
        bridge.forget(ctx.task_id)


async def _poll(bridge: HttpBridge, ctx: TaskContext, url: str, body_limit: int
                ) -> tuple[bool, Any, float | None]:
    """(ended, its value, the Retry-After asked for) from one GET of the status URL."""
    try:
        async with bridge.client.stream("GET", url, timeout=httpx.Timeout(10.0, connect=3.0)) as response:
            text = await read_bounded(response, body_limit)
    except httpx.HTTPError:
        return False, None, None  # (polled again after the backoff; the timeout bounds it all)
    asked = retry_after_s(response.headers.get("retry-after"))
    if response.status_code == 202:
        body = parse_json(text)
        if isinstance(body, dict) and ("progress" in body or "message" in body):
            await report_progress(ctx, {k: v for k, v in body.items() if k in ("progress", "message")})
        return False, None, asked
    if response.status_code in (429, 503) and asked is not None:
        return False, None, asked
    return True, interpret(response.status_code, text, response.headers), None
