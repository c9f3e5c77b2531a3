"""Running one attempt of a task: call the handler and classify the end.

The execution timeout is kept by the worker (attempts.py, one timer for all its running
attempts rather than one per attempt): it marks the context timed out and cancels the attempt.
Async handlers are cancelled then. Sync handlers run in a thread that cannot be stopped: the
attempt is reported as timed out (retryable) and whatever the thread returns later is thrown
away, so a late result never reaches Redis; the end names the call still running, whose slot
the worker keeps taken until it returns.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import time
from concurrent.futures import Executor, Future
from dataclasses import dataclass, replace
from typing import Any

from pydantic import BaseModel

from agent_worker.binding import Binding
from agent_worker.classify import classify, describe
from agent_worker.context import TaskContext
from broker import codec, limits
from broker.errors import InvalidPayload
from broker.models import Outcome


@dataclass(frozen=True, slots=True)
class AttemptEnd:
    outcome: Outcome
    body: str
    """The result's JSON on success, else the error text."""
    exec_ms: int
    retry_after_s: float | None = None
    still_running: Future[Any] | None = None
    """A sync handler's call that went on in its thread past the attempt's end (a timeout):
    Python cannot stop a thread, so its slot stays taken until the call returns."""


async def run_attempt(binding: Binding, ctx: TaskContext, payload_text: str,
                      threads: Executor, max_result_bytes: int,
                      retry_failures: bool | None = None,
                      max_depth: int = limits.DEFAULT_MAX_DEPTH) -> AttemptEnd:
    """`retry_failures`: the capability's policy (None: the binding's own setting). A result
    over `max_result_bytes` or nested deeper than `max_depth` ends the task as bad_result."""
    started = time.perf_counter()

    def end(outcome: Outcome, body: str, retry_after_s: float | None = None) -> AttemptEnd:
        return AttemptEnd(outcome, body, round((time.perf_counter() - started) * 1000), retry_after_s)

    def timed_out() -> AttemptEnd:
        return end(Outcome.RETRYABLE_FAILURE, f"execution timeout: ran longer than {ctx.timeout_s:g}s")

    try:
        payload = binding.parse_payload(codec.loads(payload_text))
    except ValueError as exc:  # not JSON, or not what the handler's payload model accepts
        return end(Outcome.INVALID_REQUEST, f"invalid payload: {describe(exc)}")
    future: Future[Any] | None = None
    try:
        if binding.is_async:
            result = await binding.handler(ctx, payload)
        else:
            loop = asyncio.get_running_loop()
            call = functools.partial(binding.handler, ctx, payload)
            # (in a copy of this context: the handler's log lines are about its task)
            future = threads.submit(contextvars.copy_context().run, call)
            result = await asyncio.wrap_future(future, loop=loop)
    except asyncio.CancelledError:
        if ctx._timed_out:
            ended = timed_out()
            if future is not None and not future.done():
                ended = replace(ended, still_running=future)
            return ended
        if ctx.cancelled:  # canceled by the producer: the result would be discarded anyway
            return end(Outcome.FAILURE, "canceled while running")
        raise
    except SystemExit as exc:
        # (sys.exit() in a handler would end the whole worker, with its other tasks, unreported)
        return end(Outcome.FAILURE, f"handler raised SystemExit({exc.code!r}); a handler must "
                                    "not exit the worker")
    except Exception as exc:
        if ctx._timed_out:  # (a handler that turned the cancellation into an error of its own)
            return timed_out()
        retry = binding.retry_failures if retry_failures is None else retry_failures
        return end(classify(exc, retry_failures=retry), describe(exc),
                   _retry_after(exc))
    if ctx._timed_out:  # (a handler that swallowed the cancellation: too late all the same)
        return timed_out()
    try:
        if isinstance(result, BaseModel):
            result = result.model_dump(mode="json")
        body = codec.encode_payload(result, max_result_bytes, "result", max_depth, "max_result_bytes")
    except InvalidPayload as exc:
        return end(Outcome.BAD_RESULT, f"handler returned a bad result: {exc}")
    except Exception as exc:  # (a model whose serializer fails, a value JSON cannot encode)
        return end(Outcome.BAD_RESULT, f"handler returned a bad result: {describe(exc)}")
    return end(Outcome.SUCCESS, body)


def _retry_after(exc: BaseException) -> float | None:
    """The exception's `retry_after_s` hint, when it is a number of seconds (else none)."""
    value = getattr(exc, "retry_after_s", None)
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < 86_400 * 365:
        return float(value)
    return None
