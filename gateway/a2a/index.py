"""The tasks A2A clients submitted, newest first: what ListTasks reads (broker/keys.py A2aKeys).

Each submit adds its task to the index of all A2A tasks and to its context's; entries older
than result_ttl (their records are gone) are trimmed as new ones come, and the index of all
keeps the newest MAX_INDEXED. A page is a slice of the index after a cursor (the last entry's
time and id); a status filter reads the states of the whole index, which MAX_INDEXED bounds.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

from broker.ids import split_task_id
from broker.infra.connection import AsyncRedis
from broker.keys import A2aKeys, CapabilityKeys
from broker.settings import Settings
from gateway.a2a.mapping import a2a_state

MAX_INDEXED = 10_000
_SCAN = 500


@dataclass(frozen=True, slots=True)
class Entry:
    task_id: str
    created_ms: int


@dataclass(frozen=True, slots=True)
class Page:
    entries: list[Entry]
    next_token: str
    total: int


class BadCursor(ValueError):
    """A page token this gateway did not make."""


def encode_cursor(entry: Entry) -> str:
    return base64.urlsafe_b64encode(f"{entry.created_ms}|{entry.task_id}".encode()).decode()


def decode_cursor(token: str) -> Entry:
    try:
        created, _, task_id = base64.urlsafe_b64decode(token.encode()).decode().partition("|")
        split_task_id(task_id)
        return Entry(task_id, int(created))
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise BadCursor(f"page token {token[:40]!r} is not one this gateway gave") from None


class TaskIndex:
    def __init__(self, settings: Settings, redis: AsyncRedis) -> None:
        self.settings = settings
        self.redis = redis
        self.keys = A2aKeys(settings.prefix)

    async def add(self, task_id: str, context_id: str, created_ms: int) -> None:
        ttl_ms = self.settings.result_ttl_ms
        pipe = self.redis.pipeline(transaction=False)
        for key in (self.keys.tasks, self.keys.context(context_id)):
            pipe.zadd(key, {task_id: created_ms})
            pipe.zremrangebyscore(key, "-inf", f"({created_ms - ttl_ms}")
        pipe.zremrangebyrank(self.keys.tasks, 0, -MAX_INDEXED - 1)
        pipe.pexpire(self.keys.context(context_id), ttl_ms)
        await pipe.execute()

    async def page(self, context_id: str | None, size: int, token: str | None,
                   status: int | None = None, capability: str | None = None) -> Page:
        """Up to `size` entries after the cursor `token`, of tasks in the A2A state `status`
        (any, when None) and of `capability` (any, when None); `total` counts them all."""
        after = decode_cursor(token) if token else None
        key = self.keys.context(context_id) if context_id else self.keys.tasks
        raw: Any = await self.redis.zrevrangebyscore(key, "+inf", "-inf", withscores=True)
        entries = sorted((Entry(str(m), int(s)) for m, s in raw),
                         key=lambda e: (e.created_ms, e.task_id), reverse=True)
        if capability is not None:
            entries = [e for e in entries if split_task_id(e.task_id)[0] == capability]
        if status is not None:
            states = await self._states([e.task_id for e in entries])
            entries = [e for e, state in zip(entries, states, strict=True) if state == status]
        rest = entries if after is None else [
            e for e in entries if (e.created_ms, e.task_id) < (after.created_ms, after.task_id)]
        chosen = rest[:size]
        return Page(chosen, encode_cursor(chosen[-1]) if len(rest) > size else "", len(entries))

    async def _states(self, task_ids: list[str]) -> list[int | None]:
        """Each task's A2A state (None for a task whose record expired)."""
        out: list[int | None] = []
        for start in range(0, len(task_ids), _SCAN):
            pipe = self.redis.pipeline(transaction=False)
            for task_id in task_ids[start:start + _SCAN]:
                capability, local = split_task_id(task_id)
                pipe.hmget(CapabilityKeys(self.settings.prefix, capability).task(local), "state", "reason")
            out += [a2a_state(state, reason) if state else None for state, reason in await pipe.execute()]
        return out
