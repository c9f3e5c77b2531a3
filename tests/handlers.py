"""Handlers the tests run inside real `reach-worker` processes (`--handler tests.handlers:X`).

Side effects that tests assert on (how many times each task ran) are counted in Redis under
the test's own prefix, so they survive a worker being killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from typing import Any

import redis

from agent_worker import InvalidRequest, Retryable, TaskContext

_client: Any = None


def _redis() -> Any:
    """The test's Redis (a cluster client on the cluster target), from the worker's settings."""
    global _client
    if _client is None:
        from broker import Settings
        from broker.infra import connection

        _client = connection.sync_client(Settings.load())
    return _client


def _runs_key() -> str:
    return f"{os.environ['REACH_PREFIX']}:test:runs"


def count_run(key: str) -> int:
    return int(_redis().hincrby(_runs_key(), key, 1))


def runs(client: redis.Redis, prefix: str) -> dict[str, int]:
    return {k: int(v) for k, v in client.hgetall(f"{prefix}:test:runs").items()}


def run_order(client: redis.Redis, prefix: str) -> list[str]:
    return list(client.lrange(f"{prefix}:test:order", 0, -1))


async def record_order(ctx: TaskContext, payload: Any) -> Any:
    """Like `record`, and appends payload["n"] to a list: the order the tasks ran in (start
    times are whole milliseconds, too coarse to order fast tasks)."""
    _redis().rpush(f"{os.environ['REACH_PREFIX']}:test:order", str(payload["n"]))
    count_run(str(payload["n"]))
    return payload


async def record(ctx: TaskContext, payload: Any) -> Any:
    """Counts each execution per payload["n"] and echoes the payload."""
    count_run(str(payload["n"]))
    return payload


def record_sync(ctx: TaskContext, payload: Any) -> Any:
    count_run(str(payload["n"]))
    return {"n": payload["n"], "sync": True}


async def sleepy(ctx: TaskContext, payload: Any) -> Any:
    """Sleeps payload["s"] seconds (async), counting the run first; a later attempt sleeps
    payload["then_s"] if given (a test that needs the first attempt long, not the rest)."""
    count_run(str(payload.get("n", ctx.task_id)))
    seconds = payload.get("s", 1.0) if ctx.attempt == 1 else payload.get("then_s", payload.get("s", 1.0))
    await asyncio.sleep(float(seconds))
    return {"slept": seconds, "attempt": ctx.attempt}


def sleepy_sync(ctx: TaskContext, payload: Any) -> Any:
    count_run(str(payload.get("n", ctx.task_id)))
    time.sleep(float(payload.get("s", 1.0)))
    return {"slept": payload.get("s", 1.0)}


def outlives_its_attempt_sync(ctx: TaskContext, payload: Any) -> Any:
    """Attempt 1 runs past its execution timeout, waits until attempt 2 of the same task runs
    in this worker, then reports progress (a superseded attempt's report, to be dropped) and
    marks that it did; attempt 2 waits for that mark and succeeds."""
    flags = f"{os.environ['REACH_PREFIX']}:test:flags:{ctx.task_id}"
    r = _redis()
    deadline = time.monotonic() + 30
    if ctx.attempt == 1:
        while not r.hexists(flags, "attempt2") and time.monotonic() < deadline:
            time.sleep(0.01)
        ctx.progress(0.5, "from attempt 1")
        r.hset(flags, "reported", "1" if ctx.cancelled else "0")
        return {"attempt": 1}
    r.hset(flags, "attempt2", "1")
    while not r.hexists(flags, "reported") and time.monotonic() < deadline:
        time.sleep(0.01)
    return {"attempt": ctx.attempt, "old_attempt_told_superseded": r.hget(flags, "reported") == "1"}


def hangs_sync(ctx: TaskContext, payload: Any) -> Any:
    """Blocks its thread (past any timeout) when payload["hang"], else echoes the payload."""
    if payload.get("hang"):
        time.sleep(600)
    return payload


async def ignores_cancel(ctx: TaskContext, payload: Any) -> Any:
    """Swallows every cancellation when payload["hang"] (a handler that never stops when told),
    else echoes the payload."""
    while payload.get("hang"):
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(600)
    return payload


async def blocks_loop(ctx: TaskContext, payload: Any) -> Any:
    """Blocks the event loop (a badly written async handler): the executor is stuck."""
    time.sleep(float(payload.get("s", 3.0)))
    return {"blocked": True}


async def progress_steps(ctx: TaskContext, payload: Any) -> Any:
    for i in range(int(payload.get("steps", 3))):
        await ctx.progress((i + 1) / int(payload.get("steps", 3)), f"step {i + 1}")
    return {"done": True}


def progress_steps_sync(ctx: TaskContext, payload: Any) -> Any:
    for i in range(3):
        ctx.progress((i + 1) / 3, f"step {i + 1}")
    return {"done": True}


async def flaky(ctx: TaskContext, payload: Any) -> Any:
    """Fails with a retryable error until attempt payload["succeed_on"]."""
    count_run(str(payload["n"]))
    if ctx.attempt < int(payload.get("succeed_on", 2)):
        raise Retryable(f"transient failure on attempt {ctx.attempt}")
    return {"attempt": ctx.attempt}


async def always_retryable(ctx: TaskContext, payload: Any) -> Any:
    count_run(str(payload["n"]))
    raise Retryable("upstream rate limit")


async def invalid(ctx: TaskContext, payload: Any) -> Any:
    count_run(str(payload["n"]))
    raise InvalidRequest("payload lacks a field")


async def boom(ctx: TaskContext, payload: Any) -> Any:
    count_run(str(payload["n"]))
    raise RuntimeError("handler crashed")


async def bad_result(ctx: TaskContext, payload: Any) -> Any:
    return {"value": float("nan")}


async def set_result(ctx: TaskContext, payload: Any) -> Any:
    return {1, 2, 3}


async def circular_result(ctx: TaskContext, payload: Any) -> Any:
    result: dict[str, Any] = {"n": 1}
    result["self"] = result
    return result


async def deep_result(ctx: TaskContext, payload: Any) -> Any:
    result: list[Any] = []
    inner = result
    for _ in range(100_000):
        inner.append([])
        inner = inner[0]
    return result


async def exits(ctx: TaskContext, payload: Any) -> Any:
    count_run(str(payload["n"]))
    sys.exit(3)


async def bad_retry_hint(ctx: TaskContext, payload: Any) -> Any:
    count_run(str(payload["n"]))
    raise Retryable("upstream busy", retry_after_s="soon")  # type: ignore[arg-type]


async def watch_cancel(ctx: TaskContext, payload: Any) -> Any:
    """Runs until canceled (or payload["s"] seconds); records what it saw."""
    key = f"{os.environ['REACH_PREFIX']}:test:cancel"
    _redis().hset(key, ctx.task_id, "started")
    try:
        deadline = time.monotonic() + float(payload.get("s", 30))
        while time.monotonic() < deadline and not ctx.cancelled:
            await asyncio.sleep(0.02)
        _redis().hset(key, ctx.task_id, "saw-cancel" if ctx.cancelled else "finished")
    except asyncio.CancelledError:
        _redis().hset(key, ctx.task_id, "cancelled")
        raise
    return {"finished": True}


async def concurrency_probe(ctx: TaskContext, payload: Any) -> Any:
    """Records the highest number of tasks this agent ran at once."""
    prefix = os.environ["REACH_PREFIX"]
    agent = os.environ.get("REACH_TEST_AGENT", "agent")
    now = _redis().hincrby(f"{prefix}:test:now", agent, 1)
    _redis().eval("if tonumber(ARGV[1]) > tonumber(redis.call('HGET', KEYS[1], ARGV[2]) or '0') "
                  "then redis.call('HSET', KEYS[1], ARGV[2], ARGV[1]) end", 1,
                  f"{prefix}:test:max", now, agent)
    try:
        count_run(str(payload["n"]))
        await asyncio.sleep(float(payload.get("s", 0.05)))
    finally:
        _redis().hincrby(f"{prefix}:test:now", agent, -1)
    return {"n": payload["n"]}


async def dies(ctx: TaskContext, payload: Any) -> Any:
    """Kills its worker process at once, before the start of the attempt can be recorded."""
    count_run(str(payload["n"]))
    os._exit(3)


async def record_due(ctx: TaskContext, payload: Any) -> Any:
    """Appends the due time of the schedule that made the task (its metadata) to a list."""
    _redis().rpush(f"{os.environ['REACH_PREFIX']}:test:dues", str(ctx.metadata.get("due_at")))
    return {"due_at": ctx.metadata.get("due_at")}


async def stamps_start(ctx: TaskContext, payload: Any) -> Any:
    """Writes when it started (ms, this host's clock) to `<prefix>:test:start:<task id>`, then
    sleeps payload["s"] seconds."""
    _redis().set(f"{os.environ['REACH_PREFIX']}:test:start:{ctx.task_id}", str(round(time.time() * 1000)))
    await asyncio.sleep(float(payload["s"]))
    return {"slept": payload["s"]}
