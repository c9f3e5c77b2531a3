"""The Reach agents' handler: `reach-worker --handler bench.fleet.agents.reach_handler:handle`.

Sleeps asynchronously for the task's drawn duration (times the agent's factor) and logs each
execution (see bench/fleet/behaviour.py). The black hole raises `Retryable`, Reach's retryable
failure, at once.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agent_worker import Retryable, TaskContext
from bench.fleet.behaviour import behaviour


async def handle(ctx: TaskContext, payload: dict[str, Any]) -> dict[str, int]:
    b = behaviour()
    task = int(payload["i"])
    started = b.start(task)
    if b.fails():
        b.end(task, started, False)
        raise Retryable("upstream key expired")
    try:
        await asyncio.sleep(b.seconds(float(payload["d"]), started))
    except BaseException:
        b.end(task, started, False)
        raise
    b.end(task, started, True)
    return {"i": task}
