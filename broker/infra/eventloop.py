"""The event loop Reach's own processes run on (reach-worker and reach dispatcher).

uvloop when it is installed (a dependency on Linux and macOS), else asyncio's own loop. Both
processes spend most of their CPU in the loop's socket and callback machinery, which libuv does
in C: in `python -m bench --only reach` a worker took about a tenth less CPU per task and the
two-worker drain was faster (docs/benchmarks.md). REACH_EVENT_LOOP=asyncio keeps the standard
loop (asyncio's debug mode, or a platform where uvloop misbehaves); =uvloop insists on it.
A library user's loop is never touched: the async client runs on whatever loop its caller has.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

from broker.errors import ConfigError

ENV = "REACH_EVENT_LOOP"
CHOICES = ("auto", "uvloop", "asyncio")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """What makes the loop, as REACH_EVENT_LOOP chooses (auto: uvloop if importable)."""
    choice = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if choice not in CHOICES:
        raise ConfigError(f"{ENV} must be one of {', '.join(CHOICES)}, not {choice!r}")
    if choice == "asyncio":
        return asyncio.new_event_loop
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise ConfigError(f"{ENV}=uvloop but uvloop is not installed (pip install uvloop)") from None
        return asyncio.new_event_loop
    return uvloop.new_event_loop


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
