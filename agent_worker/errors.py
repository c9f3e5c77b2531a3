"""What a handler raises to say how a task ended when it did not succeed.

    raise InvalidRequest("text is empty")      # the input is bad: never retried
    raise Retryable("rate limited", retry_after_s=2)   # try again later (with backoff)

Any other exception is a `failure` (never retried), unless the capability is configured with
`retry_failures = true`. TimeoutError and ConnectionError count as retryable.
"""

from __future__ import annotations


class InvalidRequest(Exception):
    """The request itself is wrong (bad input). The task fails at once with `invalid_request`."""


class Retryable(Exception):
    """A transient failure (rate limit, upstream timeout). The task is retried with backoff."""

    def __init__(self, message: str = "", *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
