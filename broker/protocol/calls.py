"""What every script call shares: the call itself, the status words replies use, and the
arguments most scripts take about where events go."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from broker.errors import ReachError, TokenRefused
from broker.keys import Channels
from broker.settings import Settings

Arg = str | int | float


@dataclass(frozen=True, slots=True)
class ScriptCall:
    name: str
    keys: list[str]
    args: list[Arg]


class Status(StrEnum):
    """The words the scripts answer with, about a call or about one task of it."""

    OK = "ok"
    REFUSED = "refused"
    """The agent's token is not the one registered (the whole call did nothing)."""
    FULL = "full"
    """The ready queue is at max_queue_depth (submit did nothing)."""
    NEW = "new"
    DUP = "dup"
    """Applied already: a retried call, or an idempotency key seen before."""
    GONE = "gone"
    """The task's record no longer exists."""
    STALE = "stale"
    """The report is from an attempt that was superseded (the fence moved)."""
    CANCELED = "canceled"
    DONE = "done"
    FAILED = "failed"
    RETRY = "retry"
    EXPIRED = "expired"
    UNKNOWN = "unknown"
    """The agent is not registered."""
    TERMINAL = "terminal"
    MOVED = "moved"
    REVOKED = "revoked"
    """The operator revoked this agent's token (the agent stops)."""
    LIVE = "live"
    """Registration refused: the agent id is live and held by another process."""
    SECRET_REQUIRED = "secret_required"
    """Registration refused: the fleet has a join secret and none was given."""
    SECRET_WRONG = "secret_wrong"
    """Registration refused: the join secret given is not the fleet's."""


def is_refused(reply: Any) -> bool:
    """Whether a script refused the call for the agent's token ({'refused'} or 'refused')."""
    if isinstance(reply, list):
        return bool(reply) and reply[0] == Status.REFUSED
    return bool(reply == Status.REFUSED)


def refusal(agent_id: str, what: str) -> ReachError:
    """The error a refused call means, for callers that raise rather than register again."""
    return TokenRefused(f"the registry refused the token of agent {agent_id!r} ({what})")


def feed_args(settings: Settings) -> list[Arg]:
    """Where a script's events go: [feed maxlen, task channel prefix]."""
    return [settings.event_feed_maxlen, Channels(settings.prefix).task_prefix]


def wake_channel(settings: Settings) -> str:
    return Channels(settings.prefix).wake
