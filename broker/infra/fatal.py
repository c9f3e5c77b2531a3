"""Errors no retry can fix, which end a long-running process at once.

A worker's and a dispatcher's loops retry whatever fails (a dead loop in a live process is
worse than a crash), but a refusal by Redis's ACL is configuration: retrying it only fills
the log. `guard(role, stop)` at the start of a process's run makes every loop it starts
(asyncio tasks copy the context they are created in; a thread that should see it is started
inside `copy_context().run`) ask `stops(exc)` before retrying: a permission error is logged
once, with the role's hint (broker/acl.py), and the process is told to stop.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field

from broker.acl import denied, is_permission_error
from broker.errors import PermissionDenied

log = logging.getLogger("reach.fatal")


@dataclass(eq=False)
class Guard:
    role: str
    stop: Callable[[PermissionDenied], object]
    """Called once, with the error, from whichever thread met it first."""
    error: PermissionDenied | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def stops(self, exc: BaseException) -> bool:
        """Whether `exc` ends the process (the first such error is logged and stops it)."""
        if isinstance(exc, PermissionDenied):
            error = exc
        elif is_permission_error(exc):
            error = denied(exc, self.role)
        else:
            return False
        with self._lock:
            first, self.error = self.error is None, self.error or error
        if first:
            log.error("%s; stopping", error)
            self.stop(error)
        return True


_current: ContextVar[Guard | None] = ContextVar("reach_fatal_guard", default=None)


def guard(role: str, stop: Callable[[PermissionDenied], object]) -> Guard:
    """Install a guard for this context (the loops started from here on)."""
    made = Guard(role, stop)
    _current.set(made)
    return made


def stops(exc: BaseException) -> bool:
    """Whether `exc` ends this process (see Guard.stops); False where no guard is installed,
    and for every error that is not a permission error."""
    current = _current.get()
    return current is not None and current.stops(exc)
