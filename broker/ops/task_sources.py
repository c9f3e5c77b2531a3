"""Where a task search finds its candidates, each newest first, in chunks read as needed.

    index      P:{cap}:tasks, every task by submit time (one ZADD per submit call)
    canceled   P:{cap}:canceled, by cancel time
    dead       the DLQ stream, by the time each task failed (every failed task has its letter)
    live       a small live structure read whole: the ready queue (queued), the delayed zset
               (scheduled, retrying) or the inboxes (dispatched, running), ordered by the
               tasks' submit times as the index holds them

A candidate is a position (broker/ops/task_cursor.py) and the task's local id; the search reads
the task's record to tell whether it matches.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from broker.infra.connection import SyncRedis
from broker.ops.task_cursor import Position, is_after, stream_start, stream_tie, zset_start
from broker.protocol.search import dlq_page_call, parse_dlq_page
from broker.scripts import Scripts
from broker.settings import Settings

CHUNK = 500
"""Entries read from a zset or a stream at once."""
LIVE_MAX = 2000
"""A live structure at most this long is read whole; a longer one is dense enough in the index
that walking the index finds its tasks fast."""


@dataclass(frozen=True, slots=True)
class Candidate:
    position: Position
    local_id: str


def _bound(score: int | None, inclusive: bool) -> str:
    if score is None:
        return "+inf"
    return str(score) if inclusive else f"({score}"


def walk_zset(client: SyncRedis, key: str, capability: str, cursor: Position | None,
              since_ms: int | None, chunk: int = CHUNK) -> Iterator[Candidate]:
    """A zset of local ids scored by time, from the cursor down to `since_ms`.

    Equal scores come in reverse member order; `offset` counts those of the lowest score seen
    so far, so a chunk that ends inside a run of equal scores goes on where it stopped."""
    top, inclusive = zset_start(capability, cursor)
    low = "-inf" if since_ms is None else str(since_ms)
    offset = 0
    while True:
        items: Any = client.zrevrangebyscore(key, _bound(top, inclusive), low, start=offset,
                                             num=chunk, withscores=True)
        if not items:
            return
        for member, score in items:
            position = Position(int(score), capability, member)
            if is_after(position, cursor):
                yield Candidate(position, member)
        if len(items) < chunk:
            return
        last = int(items[-1][1])
        at_last = sum(1 for _, score in items if int(score) == last)
        offset = offset + at_last if (last == top and inclusive) else at_last
        top, inclusive = last, True


def walk_dead_letters(scripts: Scripts, settings: Settings, capability: str, cursor: Position | None,
                      since_ms: int | None, chunk: int = CHUNK) -> Iterator[Candidate]:
    """The DLQ's task ids, newest letter first (dlq_scan.lua reads only the light fields)."""
    end = stream_start(capability, cursor)
    start = "-" if since_ms is None else str(since_ms)
    while True:
        page = parse_dlq_page(scripts(dlq_page_call(settings, capability, end, start, chunk)))
        for entry_id, task_id in page:
            ms, tie = stream_tie(entry_id)
            _, _, local = task_id.partition(":")
            if local:
                yield Candidate(Position(ms, capability, tie), local)
        if len(page) < chunk:
            return
        end = f"({page[-1][0]}"


def live_members(client: SyncRedis, structure: str, keys: Any) -> list[str] | None:
    """The local ids in a live structure ('queue', 'delayed' or 'inboxes'); None when it holds
    more than LIVE_MAX (the index serves better then)."""
    if structure in ("queue", "delayed"):
        key = keys.queue if structure == "queue" else keys.delayed
        if int(client.zcard(key)) > LIVE_MAX:
            return None
        return [str(m) for m in client.zrange(key, 0, LIVE_MAX)]
    agents = sorted(str(a) for a in client.smembers(keys.inboxes))
    if not agents:
        return []
    pipe = client.pipeline(transaction=False)
    for agent in agents:
        pipe.xlen(keys.inbox(agent))
    if sum(int(n) for n in pipe.execute()) > LIVE_MAX:
        return None
    for agent in agents:
        pipe.xrange(keys.inbox(agent), "-", "+", count=LIVE_MAX)
    found: list[str] = []
    for entries in pipe.execute():
        found += [str(fields["id"]) for _, fields in entries if fields and fields.get("id")]
    return found


def order_live(client: SyncRedis, index_key: str, capability: str, members: list[str],
               cursor: Position | None, since_ms: int | None) -> list[Candidate]:
    """Live tasks as candidates, by their submit times in the index (a task the index no
    longer holds counts as the oldest), newest first, after the cursor."""
    if not members:
        return []
    scores: Any = client.zmscore(index_key, members)
    out = []
    for member, score in zip(members, scores, strict=True):
        position = Position(int(score or 0), capability, member)
        if is_after(position, cursor) and (since_ms is None or position.score >= since_ms):
            out.append(Candidate(position, member))
    out.sort(key=lambda c: c.position, reverse=True)
    return out
