"""Handlers for tests/test_metrics.py: each task says how it ends, and each logs a line from
inside the handler (a sync one from its thread), which must carry the task's fields."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from agent_worker import InvalidRequest, Retryable, TaskContext

log = logging.getLogger("tests.handler")


def _end(payload: dict[str, Any]) -> Any:
    do = payload.get("do", "ok")
    if do == "invalid":
        raise InvalidRequest("payload lacks a field")
    if do == "boom":
        raise RuntimeError("handler crashed")
    if do == "retry":
        raise Retryable("upstream rate limit")
    if do == "bad":
        return {"value": float("nan")}
    return {"ok": payload.get("n")}


async def mixed(ctx: TaskContext, payload: dict[str, Any]) -> Any:
    log.info("handling %s", payload.get("do", "ok"))
    if payload.get("s"):
        await asyncio.sleep(float(payload["s"]))
    return _end(payload)


def mixed_sync(ctx: TaskContext, payload: dict[str, Any]) -> Any:
    log.info("handling %s in a thread", payload.get("do", "ok"))
    if payload.get("s"):
        time.sleep(float(payload["s"]))
    return _end(payload)
