"""What an HTTP agent's answer means: the attempt's outcome (pure functions).

The body's business `status` decides first:

    {"status": "success", "result": ...}
    {"status": "invalid_request" | "failure" | "retryable_failure", "error": "..."}

With no `status`, the HTTP status does: 2xx is success (the whole body is the result),
408/429/500/502/503/504 are retryable (after `Retry-After`, when the agent says), other 4xx are
invalid requests, other 5xx failures.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping
from typing import Any

from agent_worker.errors import InvalidRequest, Retryable
from broker import codec

RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
BUSINESS = frozenset({"success", "invalid_request", "failure", "retryable_failure"})
_MAX_RETRY_AFTER_S = 86_400.0


class AgentFailed(Exception):
    """The HTTP agent said the task failed (business status `failure`, or an answer that means it)."""


def parse_json(text: bytes | str) -> Any:
    """The answer's JSON, or None when it is empty or not strict JSON."""
    if not text:
        return None
    try:
        return codec.loads(text)
    except (ValueError, RecursionError):
        return None


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """Seconds a `Retry-After` header asks for (a number, or an HTTP date), or None."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():  # ('¹'.isdigit() too, and float('¹') fails)
        return min(float(value), _MAX_RETRY_AFTER_S)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    delay = when.timestamp() - (time.time() if now is None else now)
    return min(max(delay, 0.0), _MAX_RETRY_AFTER_S)


def is_business(body: Any) -> bool:
    """Whether a JSON body carries a business status (it is an outcome, whatever the HTTP status)."""
    return isinstance(body, dict) and isinstance(body.get("status"), str)


def business_outcome(body: dict[str, Any], retry_after: float | None = None) -> Any:
    """The result of a body with a business status, or the exception that status means."""
    status = body["status"]
    error = body.get("error")
    error_text = str(error) if error not in (None, "") else f"agent answered {status}"
    if status == "success":
        return body.get("result")
    if status == "invalid_request":
        raise InvalidRequest(error_text)
    if status == "retryable_failure":
        hinted = body.get("retry_after_s")
        if isinstance(hinted, int | float) and not isinstance(hinted, bool) and hinted >= 0:
            retry_after = min(float(hinted), _MAX_RETRY_AFTER_S)
        raise Retryable(error_text, retry_after_s=retry_after)
    if status == "failure":
        raise AgentFailed(error_text)
    raise AgentFailed(f"agent answered an unknown status {status!r}")


def interpret(status: int, text: bytes, headers: Mapping[str, str] | None = None) -> Any:
    """The handler's return value (or exception) for an HTTP agent's whole answer."""
    body = parse_json(text)
    wait = retry_after_s((headers or {}).get("retry-after"))
    if is_business(body):
        return business_outcome(body, wait)
    if 200 <= status < 300:
        if body is None and text:
            raise AgentFailed("agent answered 2xx with a body that is not JSON")
        return body
    message = f"agent answered HTTP {status}: {text[:200].decode('utf-8', 'replace')}".rstrip(": ")
    if status in RETRYABLE_STATUS:
        raise Retryable(message, retry_after_s=wait)
    if 400 <= status < 500:
        raise InvalidRequest(message)
    raise AgentFailed(message)
