"""How an attempt's end maps to an outcome, and how long to wait before the next attempt.

Pure functions: the worker calls them, the tests call them without Redis.
"""

from __future__ import annotations

import random

from pydantic import ValidationError
from tenacity import RetryCallState, wait_exponential, wait_random

from agent_worker.errors import InvalidRequest, Retryable
from broker.models import Outcome
from broker.settings import Settings

# Client libraries define their own network errors (redis.exceptions.ConnectionError,
# httpx.ConnectTimeout, ...) that do not derive from the builtins; they are just as transient.
_TRANSIENT_NAMES = frozenset({"ConnectionError", "TimeoutError", "Timeout", "ConnectTimeout",
                              "ReadTimeout", "ConnectError"})


def classify(exc: BaseException, *, retry_failures: bool = False) -> Outcome:
    """The outcome of an attempt that raised `exc` (DESIGN.md's worker-side mapping)."""
    if isinstance(exc, InvalidRequest | ValidationError):
        return Outcome.INVALID_REQUEST
    if isinstance(exc, Retryable | TimeoutError | ConnectionError) or any(
        cls.__name__ in _TRANSIENT_NAMES for cls in type(exc).__mro__
    ):
        return Outcome.RETRYABLE_FAILURE
    return Outcome.RETRYABLE_FAILURE if retry_failures else Outcome.FAILURE


def describe(exc: BaseException) -> str:
    """A one-line error text for the task record (type and message, never a traceback)."""
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "payload"
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        return f"{where}: {first['msg']}{more}"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    name = type(exc).__name__
    return f"{name}: {text}"[:1000] if text else name


def backoff_ms(attempt: int, settings: Settings, rng: random.Random | None = None) -> int:
    """Delay before the attempt after `attempt` (1-based): base * 2^(attempt-1), capped, plus
    jitter U(0, jitter). Computed with tenacity's wait strategies."""
    wait = wait_exponential(
        multiplier=settings.backoff_base_ms / 1000, max=settings.backoff_max_ms / 1000, exp_base=2
    ) + wait_random(0, settings.backoff_jitter_ms / 1000)
    state = RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
    state.attempt_number = max(1, attempt)
    if rng is not None:  # deterministic jitter for tests
        base = wait_exponential(
            multiplier=settings.backoff_base_ms / 1000, max=settings.backoff_max_ms / 1000, exp_base=2
        )(state)
        return round((base + rng.uniform(0, settings.backoff_jitter_ms / 1000)) * 1000)
    return round(wait(state) * 1000)
