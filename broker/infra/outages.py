"""Riding out Redis being away: which errors mean that, and how each kind of caller waits.

A short operation (a producer's submit) retries for a few seconds and then raises
BrokerUnavailable; a long-running loop (a worker's report, a dispatcher's round) retries until
Redis is back (`with_reconnect`); a wait (result, events) rides out up to WAIT_OUTAGE_S.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis
from tenacity import (
    AsyncRetrying,
    Retrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential,
    wait_random,
)

from broker.errors import BrokerUnavailable
from broker.settings import Settings

log = logging.getLogger("reach.connection")

T = TypeVar("T")

# Errors that mean "Redis is not reachable right now" (as opposed to a bad command).
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ClusterDownError,  # also MasterDownError
    redis.exceptions.TryAgainError,
    redis.exceptions.SlotNotCoveredError,  # a slot whose master died, before its failover
    redis.exceptions.BusyLoadingError,
    ConnectionError,
)
# (Not OSError: the builtin TimeoutError is one, and a wait that times out is not Redis's fault.)

WAIT_OUTAGE_S = 15.0
"""How long a wait (result, events) rides out Redis being unreachable before it gives up."""

WRITE_GIVE_UP_S = 5.0
"""How long a producer's write retries before it raises BrokerUnavailable."""


class WaitOutage:
    """Backoff for a wait while Redis is unreachable; BrokerUnavailable when it lasts too long."""

    def __init__(self, settings: Settings, deadline: float | None) -> None:
        self.settings = settings
        self.deadline = deadline
        self.since: float | None = None
        self.pause = 0.05

    def over(self) -> None:
        self.since = None
        self.pause = 0.05

    def next_pause(self, exc: BaseException) -> float:
        now = time.monotonic()
        self.since = self.since or now
        if now - self.since > WAIT_OUTAGE_S or (self.deadline is not None and now > self.deadline):
            raise unavailable(exc, self.settings) from exc
        pause, self.pause = self.pause, min(self.pause * 2, 1.0)
        return pause


def unavailable(exc: BaseException, settings: Settings) -> BrokerUnavailable:
    return BrokerUnavailable(f"Redis at {settings.redacted_url()} is unavailable: {exc}{tls_hint(exc)}")


def tls_hint(exc: BaseException) -> str:
    """What to do about a TLS handshake that failed for the certificate (else '')."""
    text = str(exc)
    if "CERTIFICATE_VERIFY_FAILED" not in text and "certificate verify failed" not in text:
        return ""
    if "mismatch" in text.lower():  # ("Hostname mismatch", "IP address mismatch")
        return (" (the server's TLS certificate is not for this host name: connect by a name it "
                "names, or get it a certificate that names this one)")
    return (" (the server's TLS certificate is not trusted: point tls_ca_file / REACH_TLS_CA_FILE, "
            "or ?ssl_ca_certs= in the URL, at the CA that signed it)")


def retrying(give_up_after_s: float = WRITE_GIVE_UP_S) -> Retrying:
    """Retry a short operation on transient Redis errors with jittered exponential backoff."""
    return Retrying(
        retry=retry_if_exception_type(TRANSIENT_ERRORS),
        wait=wait_exponential(multiplier=0.05, max=1.0) + wait_random(0, 0.05),
        stop=stop_after_delay(give_up_after_s),
        reraise=True,
    )


def _async_retrying(give_up_after_s: float) -> AsyncRetrying:
    """`retrying` for asyncio callers (the same backoff)."""
    return AsyncRetrying(
        retry=retry_if_exception_type(TRANSIENT_ERRORS),
        wait=wait_exponential(multiplier=0.05, max=1.0) + wait_random(0, 0.05),
        stop=stop_after_delay(give_up_after_s),
        reraise=True,
        before_sleep=_log_retry,
    )


def _log_retry(state: Any) -> None:
    exc = state.outcome.exception() if state.outcome else None
    log.warning("Redis unavailable (%s); retrying in %.1fs", exc, state.next_action.sleep)


def write_with_retry(op: Callable[[], T]) -> T:
    """A producer's write: once as is (the common case builds no retry machinery), then
    retried for WRITE_GIVE_UP_S. Safe only for writes the scripts make idempotent."""
    try:
        return op()
    except TRANSIENT_ERRORS:
        pass
    for attempt in retrying():
        with attempt:
            return op()
    raise AssertionError("unreachable")


async def async_write_with_retry(op: Callable[[], Awaitable[T]]) -> T:
    """write_with_retry for the asyncio client."""
    try:
        return await op()
    except TRANSIENT_ERRORS:
        pass
    async for attempt in _async_retrying(WRITE_GIVE_UP_S):
        with attempt:
            return await op()
    raise AssertionError("unreachable")


async def with_reconnect(op: Callable[[], Awaitable[T]]) -> T:
    """Run `op` until it succeeds, backing off while Redis is away (long-running loops)."""
    try:  # the common case, without building a retry state machine for every call
        return await op()
    except TRANSIENT_ERRORS as exc:
        log.warning("Redis unavailable (%s); retrying", exc)
    async for attempt in _reconnecting():
        with attempt:
            return await op()
    raise AssertionError("unreachable")


def _reconnecting() -> AsyncRetrying:
    return AsyncRetrying(
        retry=retry_if_exception_type(TRANSIENT_ERRORS),
        wait=wait_exponential(multiplier=0.1, max=5.0) + wait_random(0, 0.1),
        reraise=True,
        before_sleep=_log_retry,
    )
