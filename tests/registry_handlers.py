"""Handlers for the registry tests (`--handler tests.registry_handlers:X` in a real worker)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from typing import Any

from agent_worker import TaskContext
from tests.handlers import _redis, count_run


def unblocked_key(prefix: str) -> str:
    return f"{prefix}:test:unblocked"


async def clock(ctx: TaskContext, payload: Any) -> Any:
    """Sleeps payload["s"] seconds without blocking, then tells what this process thinks the time is."""
    await asyncio.sleep(float(payload.get("s", 0)))
    return {"time": time.time(), "time_ns": time.time_ns(), "attempt": ctx.attempt}


async def stall(ctx: TaskContext, payload: Any) -> Any:
    """Blocks the worker's event loop for payload["s"] seconds (a badly written async handler),
    then records the Redis server time at which the loop was free again (ms), under payload["n"]."""
    time.sleep(float(payload.get("s", 3.0)))
    seconds, micros = _redis().time()
    _redis().hset(unblocked_key(os.environ["REACH_PREFIX"]), str(payload["n"]),
                  int(seconds) * 1000 + int(micros) // 1000)
    return {"blocked_s": payload.get("s", 3.0)}


async def slow_first_attempt(ctx: TaskContext, payload: Any) -> Any:
    """Counts the run; the first attempt sleeps payload["s"] seconds, later ones return at once."""
    count_run(str(payload["n"]))
    if ctx.attempt == 1:
        await asyncio.sleep(float(payload.get("s", 30)))
    return {"attempt": ctx.attempt}


async def deaf_first_attempt(ctx: TaskContext, payload: Any) -> Any:
    """slow_first_attempt, whose first attempt also swallows every cancellation (for at most
    payload["s"] seconds, so that no test leaves it running for good)."""
    count_run(str(payload["n"]))
    if ctx.attempt == 1:
        end = time.monotonic() + float(payload.get("s", 30))
        while time.monotonic() < end:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0.05)
    return {"attempt": ctx.attempt}
