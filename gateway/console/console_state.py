"""What the console keeps in a gateway process: the session secret, the live hub, and the
dead-letter tools on the gateway's synchronous client (state it can rebuild at any time:
Redis holds everything)."""

from __future__ import annotations

from typing import Any

from dlq_tools import DeadLetters
from gateway.console.live import LiveHub
from gateway.console.session import Secret
from gateway.state import GatewayState


class ConsoleState:
    def __init__(self, gw: GatewayState) -> None:
        self.secret = Secret(gw.settings, gw.redis)
        self.hub = LiveHub(gw)
        self._gw = gw
        self._dlq: DeadLetters | None = None

    def dead_letters(self) -> DeadLetters:
        if self._dlq is None:
            self._dlq = DeadLetters(self._gw.settings, redis_client=self._gw.sync_redis())
        return self._dlq

    async def close(self) -> None:
        await self.hub.close()


def console_of(app: Any) -> ConsoleState:
    state: ConsoleState = app.state.console
    return state
