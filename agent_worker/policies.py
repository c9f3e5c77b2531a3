"""The policy fields a worker applies itself (broker/policy.py): whether an unclassified handler
exception is retried (`retry_failures`). Read from Redis once a second, so a change applies
within a second; a capability whose policy does not say keeps its binding's (the worker's
config)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from broker.infra import outages
from broker.infra.connection import AsyncRedis
from broker.keys import CapabilityKeys
from broker.policy import decode
from broker.settings import Settings

REFRESH_S = 1.0


class WorkerPolicy:
    def __init__(self, settings: Settings, redis_client: AsyncRedis, capabilities: list[str]) -> None:
        self.settings = settings
        self.redis = redis_client
        self.capabilities = capabilities
        self._retry_failures: dict[str, bool] = {}

    def retry_failures(self, capability: str, configured: bool) -> bool:
        return self._retry_failures.get(capability, configured)

    async def run(self) -> None:
        while True:
            with contextlib.suppress(*outages.TRANSIENT_ERRORS):  # (the last values stand meanwhile)
                await self.refresh()
            await asyncio.sleep(REFRESH_S)

    async def refresh(self) -> None:
        pipe = self.redis.pipeline(transaction=False)
        for capability in self.capabilities:
            pipe.hget(CapabilityKeys(self.settings.prefix, capability).policy, "retry_failures")
        values: Any = await pipe.execute()
        fresh = {}
        for capability, text in zip(self.capabilities, values, strict=True):
            value = decode("retry_failures", text)
            if value is not None:
                fresh[capability] = bool(value)
        self._retry_failures = fresh
