"""A handler whose failure a test switches on and off through Redis (the cause an operator fixes).

While `<prefix>:test:broken` exists, `switchable` fails the way payload["how"] says:
"failure" (default: an unclassified exception), "invalid" (invalid_request), "retry"
(retryable, so retries_exhausted in the end) or "bad_result" (a result that is not JSON).
Once the key is gone it succeeds. Every run is counted per payload["n"] (tests.handlers.runs).
"""

from __future__ import annotations

import os
from typing import Any

import redis

from agent_worker import InvalidRequest, Retryable, TaskContext
from tests.handlers import _redis, count_run


def broken_key(prefix: str) -> str:
    return f"{prefix}:test:broken"


def set_broken(client: redis.Redis, prefix: str, broken: bool) -> None:
    if broken:
        client.set(broken_key(prefix), "1")
    else:
        client.delete(broken_key(prefix))


async def switchable(ctx: TaskContext, payload: Any) -> Any:
    count_run(str(payload["n"]))
    if not _redis().exists(broken_key(os.environ["REACH_PREFIX"])):
        return {"n": payload["n"], "attempt": ctx.attempt}
    how = payload.get("how", "failure")
    if how == "invalid":
        raise InvalidRequest(f"task {payload['n']} lacks a field")
    if how == "retry":
        raise Retryable(f"upstream unavailable for task {payload['n']}")
    if how == "bad_result":
        return {"value": float("nan")}
    raise RuntimeError(f"downstream is broken (task {payload['n']})")
