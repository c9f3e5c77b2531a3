"""A worker's control channel: a producer's cancel reaches the attempt running its task here
(`cancel <task id>`, published by cancel.lua and expire.lua); an HTTP agent's callback, taken by
the gateway, reaches the HTTP bridge (`callback <task id>`, published by callback.lua)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from agent_worker.attempt import Running, about
from broker.infra import connection, outages
from broker.infra.connection import AsyncRedis
from broker.keys import Channels

log = logging.getLogger("reach.worker")


OtherVerb = Callable[[str, str], None]
"""Where messages other than cancels go (verb, task id): the HTTP bridge's callbacks."""


async def listen(redis_client: AsyncRedis, prefix: str, agent_id: str, running: Running,
                 other: OtherVerb | None = None) -> None:
    channel = Channels(prefix).control(agent_id)
    while True:
        pubsub = None
        try:
            pubsub = await connection.open_async_pubsub(redis_client)
            await pubsub.subscribe(channel)
            while True:
                message = await pubsub.get_message(timeout=5.0)
                if message and message.get("type") == "message":
                    on_message(str(message["data"]), running, other)
        except outages.TRANSIENT_ERRORS as exc:
            log.warning("control channel lost (%s); resubscribing", exc)
            await asyncio.sleep(1.0)
        finally:
            if pubsub is not None:
                with contextlib.suppress(*outages.TRANSIENT_ERRORS):
                    await pubsub.aclose()


def on_message(text: str, running: Running, other: OtherVerb | None = None) -> None:
    verb, _, task_id = text.partition(" ")
    if verb == "cancel":
        if (attempt := running.get(task_id)) is not None:
            log.info("task %s canceled by its producer", task_id, extra=about(attempt))
            attempt.cancel()
    elif other is not None:
        other(verb, task_id)
