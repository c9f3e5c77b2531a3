"""Handlers the gateway's tests run in real `reach-worker` processes."""

from __future__ import annotations

import asyncio
from typing import Any

from agent_worker import InvalidRequest, TaskContext


async def work(ctx: TaskContext, payload: Any) -> Any:
    """Does what the payload says: `steps` progress events `step_ms` apart, `sleep` seconds,
    `invalid` (an invalid request), `flag` (fails_while_flagged); returns the payload."""
    if not isinstance(payload, dict):
        return payload
    steps = int(payload.get("steps", 0))
    for i in range(steps):
        await asyncio.sleep(float(payload.get("step_ms", 0)) / 1000)
        await ctx.progress((i + 1) / (steps + 1), f"step {i + 1}")
    await asyncio.sleep(float(payload.get("sleep", 0)))
    if payload.get("flag"):
        return await fails_while_flagged(ctx, payload)
    if payload.get("invalid"):
        raise InvalidRequest(str(payload["invalid"]))
    return payload


async def fails_while_flagged(ctx: TaskContext, payload: Any) -> Any:
    """Fails (invalid request: straight to the DLQ) while the Redis key payload["flag"] exists;
    succeeds once it is gone (so a replay after deleting it succeeds)."""
    from broker import Settings
    from broker.infra import connection

    client = connection.sync_client(Settings.load())
    try:
        if client.exists(payload["flag"]):
            raise InvalidRequest("flagged to fail")
    finally:
        client.close()
    return {"ok": True}
