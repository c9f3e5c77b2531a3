"""Handlers for the routing tests: their behaviour is switched per agent through Redis."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from agent_worker import TaskContext
from tests.handlers import _redis


def _mode() -> str:
    agent = os.environ.get("REACH_TEST_AGENT", "")
    return _redis().hget(f"{os.environ['REACH_PREFIX']}:test:mode", agent) or ""


async def switchable(ctx: TaskContext, payload: Any) -> Any:
    """Fails while this agent's mode is 'fail'; sleeps payload['s'] (x8 in mode 'slow')."""
    mode = _mode()
    if mode == "fail":
        raise RuntimeError("this agent is broken right now")
    delay = float(payload.get("s", 0.005))
    await asyncio.sleep(delay * 8 if mode == "slow" else delay)
    return {"agent": os.environ.get("REACH_TEST_AGENT", "")}


def stall(ctx: TaskContext, payload: Any) -> Any:
    """A sync handler that never returns (a stuck dependency), holding one slot."""
    import time

    time.sleep(float(payload.get("s", 60)))
    return {}
