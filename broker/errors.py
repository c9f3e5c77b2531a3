"""Every error Agent-Reach raises, in one tree.

    ReachError
    ├── BadInput                      the caller asked for something invalid; nothing was written
    │   ├── InvalidCapability         capability name does not match ^[a-z0-9][a-z0-9_.-]{0,63}$
    │   ├── InvalidPayload            not strict JSON, or over a limit (broker/limits.py)
    │   │   ├── PayloadTooLarge       more bytes of JSON than its limit (max_payload_bytes ...)
    │   │   └── NestedTooDeep         JSON nested deeper than max_json_depth
    │   ├── InvalidPriority           not an int in 0..9
    │   ├── InvalidTaskId             not of the form "<capability>:<26-char id>"
    │   └── ConfigError               a setting or config file that cannot be used
    ├── UnknownTask                   a well-formed task id that Redis does not know (expired or never made)
    ├── QueueFull                     the capability's queue depth reached max_queue_depth
    ├── TaskFailed                    the task ended in `failed`; .reason and .error say why
    │   └── TaskCanceled              the task ended in `canceled`
    ├── BrokerUnavailable             Redis cannot be reached (transient: retry later)
    ├── TokenRefused                  an agent presented a token the registry does not accept
    │   └── RegistrationRefused       the registry refused to register an agent (id live, token
    │                                 revoked, join secret missing or wrong); .status says which
    └── PermissionDenied              Redis's ACL refused a command, key or channel (a configuration
                                      error: never retried; broker/acl.py names the role that allows it)

`TimeoutError` (the builtin) is raised when a wait ends before the task does; the task keeps running.
"""

from __future__ import annotations

from typing import Any


class ReachError(Exception):
    """Base of every error raised by Agent-Reach."""


class BadInput(ReachError, ValueError):
    """The caller passed something invalid. Nothing was written to Redis."""


class InvalidCapability(BadInput):
    pass


class InvalidPayload(BadInput):
    pass


class PayloadTooLarge(InvalidPayload):
    """A payload, result, metadata or progress message over its size limit."""


class NestedTooDeep(InvalidPayload):
    """JSON nested deeper than max_json_depth."""


class InvalidPriority(BadInput):
    pass


class InvalidTaskId(BadInput):
    pass


class ConfigError(BadInput):
    pass


class UnknownTask(ReachError, LookupError):
    def __init__(self, task_id: str) -> None:
        super().__init__(f"unknown task id {task_id!r} (never submitted, or its record expired)")
        self.task_id = task_id


class QueueFull(ReachError):
    def __init__(self, capability: str, depth: int, limit: int) -> None:
        super().__init__(
            f"queue for capability {capability!r} is full: depth {depth} reached the limit {limit}"
        )
        self.capability = capability
        self.depth = depth
        self.limit = limit
        self.submitted: list[Any] = []
        """The handles of the tasks a bulk submit queued before the queue filled up."""


class TaskFailed(ReachError):
    def __init__(self, task_id: str, reason: str, error: str | None) -> None:
        detail = f": {error}" if error else ""
        super().__init__(f"task {task_id} failed ({reason}){detail}")
        self.task_id = task_id
        self.reason = reason
        self.error = error


class TaskCanceled(TaskFailed):
    def __init__(self, task_id: str, error: str | None = None) -> None:
        super().__init__(task_id, "canceled", error)
        self.args = (f"task {task_id} was canceled",)


class BrokerUnavailable(ReachError, ConnectionError):
    """Redis could not be reached. Transient: the same call may succeed later."""


class TokenRefused(ReachError, PermissionError):
    """The registry refused an agent's token (wrong, missing, or the agent is unknown)."""


class RegistrationRefused(TokenRefused):
    """The registry refused to register an agent: its id is live and held by another process,
    its token was revoked, or the fleet's join secret was missing or wrong (`status`)."""

    def __init__(self, message: str, status: str) -> None:
        super().__init__(message)
        self.status = status


class PermissionDenied(ReachError, PermissionError):
    """Redis's ACL refused a command, a key or a channel to this process's user. Not transient:
    the user's rule must change (`reach acl --role ROLE` prints the rule each role needs)."""
