"""Running one attempt of a task: call the handler under its timeout and classify the end.

Async handlers are cancelled when they exceed the timeout. Sync handlers run in a thread that
cannot be stopped: the attempt is reported as timed out (retryable) and whatever the thread
returns later is thrown away, so a late result never reaches Redis.
"""

from __future__ import annotations

import asyncio
import functools
import time
from concurrent.futures import Executor
from dataclasses import dataclass

from pydantic import BaseModel

from agent_worker.classify import classify, describe
from agent_worker.context import TaskContext
from agent_worker.handlers import Binding
from broker import codec
from broker.errors import InvalidPayload
from broker.models import Outcome


@dataclass(frozen=True, slots=True)
class AttemptEnd:
    outcome: Outcome
    body: str
    """The result's JSON on success, else the error text."""
    exec_ms: int
    retry_after_s: float | None = None


async def run_attempt(binding: Binding, ctx: TaskContext, payload_text: str,
                      threads: Executor, max_result_bytes: int) -> AttemptEnd:
    started = time.perf_counter()

    def end(outcome: Outcome, body: str, retry_after_s: float | None = None) -> AttemptEnd:
        return AttemptEnd(outcome, body, round((time.perf_counter() - started) * 1000), retry_after_s)

    timeout = ctx.timeout_s
    try:
        payload = binding.parse_payload(codec.loads(payload_text))
    except ValueError as exc:  # not JSON, or not what the handler's payload model accepts
        return end(Outcome.INVALID_REQUEST, f"invalid payload: {describe(exc)}")
    try:
        # (asyncio.timeout, not wait_for: on 3.11 wait_for wraps the handler in one more Task)
        async with asyncio.timeout(timeout):
            if binding.is_async:
                result = await binding.handler(ctx, payload)
            else:
                loop = asyncio.get_running_loop()
                call = functools.partial(binding.handler, ctx, payload)
                result = await asyncio.wrap_future(threads.submit(call), loop=loop)
    except TimeoutError as exc:
        if time.perf_counter() - started >= timeout * 0.999:
            return end(Outcome.RETRYABLE_FAILURE, f"execution timeout: ran longer than {timeout:g}s")
        return end(Outcome.RETRYABLE_FAILURE, describe(exc))
    except asyncio.CancelledError:
        if ctx.cancelled:  # canceled by the producer: the result would be discarded anyway
            return end(Outcome.FAILURE, "canceled while running")
        raise
    except Exception as exc:
        return end(classify(exc, retry_failures=binding.retry_failures), describe(exc),
                   getattr(exc, "retry_after_s", None))
    if isinstance(result, BaseModel):
        result = result.model_dump(mode="json")
    try:
        body = codec.encode_payload(result, max_result_bytes, where="result")
    except InvalidPayload as exc:
        return end(Outcome.BAD_RESULT, f"handler returned a bad result: {exc}")
    return end(Outcome.SUCCESS, body)
