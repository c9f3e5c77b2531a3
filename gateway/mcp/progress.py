"""A task's progress events as MCP progress notifications for the call that waits on it.

MCP wants each notification's `progress` to grow: a task's fraction is used while it grows; an
event without one (or one that went back) still carries its message, its progress a hair above
the last. Nothing is sent when the client asked for no progress (the SDK drops it then).
"""

from __future__ import annotations

from typing import Any

from mcp.server.session import ServerSession

STEP = 1e-6


class ProgressReport:
    def __init__(self, session: ServerSession) -> None:
        self.session = session
        self.last = 0.0

    def next_value(self, fraction: Any) -> float:
        if isinstance(fraction, int | float) and not isinstance(fraction, bool) and self.last < fraction <= 1:
            return float(fraction)
        return min(self.last + STEP, 1.0)

    async def event(self, data: dict[str, Any]) -> None:
        """Report one progress event of the task (its data: fraction, message, ...)."""
        self.last = self.next_value(data.get("fraction"))
        message = data.get("message")
        text = str(message)[:1000] if message is not None else None
        await self.session.report_progress(self.last, 1.0, text)
