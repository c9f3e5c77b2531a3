"""A capability's ready queue as one dispatcher reads it: tasks from its front, known from their
scores alone unless they have routing constraints, with the front the last dispatch call saw
kept so that the next round needs no read of its own."""

from __future__ import annotations

from typing import Any

from broker import codec
from broker.keys import CapabilityKeys
from broker.protocol import queue_score
from dispatcher.context import DispatcherContext
from dispatcher.routing import ReadyTask

ROUTING_FIELDS = ("session_id", "region", "routing", "last_agent_id")


class ReadyQueue:
    def __init__(self, ctx: DispatcherContext, keys: CapabilityKeys) -> None:
        self.ctx = ctx
        self.keys = keys
        self.maybe_queued = True
        """Tasks may wait in the queue (cleared by a round that drains it)."""
        self._head: list[tuple[str, float]] | None = None
        """The front of the queue (local id, score) as the last dispatch call left it; dropped
        whenever the queue may have changed otherwise (new, promoted, requeued tasks all come
        with a wake-up). `_head_whole`: it is the whole queue."""
        self._head_whole = False
        self.aging_ms = ctx.settings.aging_ms
        """The capability's aging (its policy's): a task's score and priority tell when it
        became ready."""
        self.gen = 0
        """Moves whenever the head is forgotten: a peek taken before that is not installed."""

    def forget(self) -> None:
        """The queue's front may have changed: read it next time."""
        self._head = None
        self.gen += 1

    def install(self, gen: int, peeked: list[tuple[str, float]], peek: int) -> None:
        """Keep the front a dispatch call returned (asked for `peek` tasks) as the next head,
        unless the queue changed since the call was sent (`gen` then moved)."""
        if peek and gen == self.gen:
            self._head, self._head_whole = peeked, len(peeked) < peek

    async def read(self, want: int, offset: int = 0, skip: frozenset[str] = frozenset()) -> list[ReadyTask]:
        """`want` ready tasks from position `offset`, passing over those in `skip` (the dispatch
        calls in flight hand them off). The record is read only for tasks with routing
        constraints (session, region, version, an agent to avoid)."""
        head: list[tuple[str, float]]
        if (offset == 0 and self._head is not None and not skip
                and (self._head_whole or len(self._head) >= want)):
            head = self._head[:want]
        else:
            found: Any = await self.ctx.redis.zrange(self.keys.queue, offset, offset + want + len(skip) - 1,
                                                     withscores=True)
            head = found
            if skip:
                head = [entry for entry in head if entry[0] not in skip][:want]
        self._head = None
        if not head:
            return []
        return await self._tasks(head)

    async def _tasks(self, head: list[tuple[str, float]]) -> list[ReadyTask]:
        hints = [(local_id, score, *queue_score.decode(score)) for local_id, score in head]
        special = [local_id for local_id, _, _, constrained in hints if constrained]
        rows: dict[str, list[Any]] = {}
        owners: dict[str, str | None] = {}
        if special:
            r = self.ctx.redis
            pipe = r.pipeline(transaction=False)
            for local_id in special:
                pipe.hmget(self.keys.task(local_id), ROUTING_FIELDS)
            rows = dict(zip(special, await pipe.execute(), strict=True))
            sessions = sorted({row[0] for row in rows.values() if row[0]})
            if sessions:
                agents: list[Any] = await r.hmget(self.keys.sessions, sessions)
                owners = dict(zip(sessions, agents, strict=True))
        tasks = []
        for local_id, score, priority, constrained in hints:
            ready_at = queue_score.ready_at(score, priority, self.aging_ms)
            if not constrained:
                tasks.append(ReadyTask(local_id, priority, ready_at_ms=ready_at))
                continue
            session, region, extra, last_agent = rows[local_id]
            options = routing_options(extra)
            tasks.append(ReadyTask(
                local_id, priority, session or "", region or "",
                bool(options.get("region_strict", True)), str(options.get("version") or ""),
                last_agent or "", (owners.get(session) or "") if session else "", ready_at))
        return tasks


def routing_options(text: str | None) -> dict[str, Any]:
    """A task record's `routing` field (region_strict, version), {} when absent or unreadable."""
    if not text:
        return {}
    try:
        value = codec.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
