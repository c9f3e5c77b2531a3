"""Task search (`reach tasks`, `GET /v1/tasks`, the console's Tasks page): recent tasks by
capability, state, agent, trace and age, newest first, a page at a time.

Where it looks depends on the state asked for (broker/ops/task_sources.py): every task is in its
capability's index by submit time, written by submit.lua with one ZADD per call; the live states
are read from the structures that hold them while those are small (the ready queue, the delayed
zset, the inboxes); failed tasks from the DLQ; canceled ones from their own zset. So no state
needs a write on the hot paths beyond that one ZADD, and a state that is rare among recent
tasks is still found at once.

Each candidate's record is read on the server (task_rows.lua, a batch of one capability's
tasks a call), which returns only the matches. A page looks at most at `budget` records: a
filter that matches few of many tasks (an agent, a trace id) returns what that much reading
found and a cursor to go on from, so that no request holds Redis or the caller for long.
`next_cursor` is None once nothing older is left.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from broker.errors import BadInput
from broker.ids import check_capability
from broker.infra.connection import SyncRedis
from broker.keys import CapabilityKeys
from broker.models import TaskState, TaskStatus
from broker.ops.overview import capabilities as known_capabilities
from broker.ops.task_cursor import Position, decode_cursor
from broker.ops.task_sources import (
    CHUNK,
    Candidate,
    live_members,
    order_live,
    walk_dead_letters,
    walk_zset,
)
from broker.protocol.search import parse_task_rows, task_rows_call
from broker.protocol.trace import trace_filter
from broker.registry import clock_of
from broker.scripts import Scripts
from broker.settings import Settings

DEFAULT_LIMIT = 50
MAX_LIMIT = 1000
SCAN_BUDGET = 5000
"""Most records one page looks at: about 10 ms of Redis's time, in calls of CHUNK (a call holds
Redis for about 1 ms), and 30 ms for the page on a busy 2-core machine."""
MAX_LABEL = 256

ROW_FIELDS = ("id", "cap", "state", "priority", "attempt", "max_attempts", "agent_id", "created_at",
              "dispatched_at", "started_at", "finished_at", "deadline_at", "due_at", "reason",
              "error", "session_id", "region", "trace")
"""What a task row shows: its record without payload, result or events."""

_LIVE = {TaskState.QUEUED: "queue", TaskState.SCHEDULED: "delayed", TaskState.RETRYING: "delayed",
         TaskState.DISPATCHED: "inboxes", TaskState.RUNNING: "inboxes"}


@dataclass(frozen=True, slots=True)
class TaskQuery:
    capability: str | None = None
    state: TaskState | None = None
    agent_id: str | None = None
    trace_id: str | None = None
    since_ms: int | None = None
    """Only tasks at most this old (for failed and canceled ones: that failed or were canceled
    this recently)."""
    limit: int = DEFAULT_LIMIT
    cursor: str | None = None

    def checked(self) -> TaskQuery:
        if self.capability is not None:
            check_capability(self.capability)
        if not 1 <= self.limit <= MAX_LIMIT:
            raise BadInput(f"limit must be 1 to {MAX_LIMIT}, got {self.limit}")
        if self.agent_id is not None and not 0 < len(self.agent_id) <= MAX_LABEL:
            raise BadInput(f"agent must be 1 to {MAX_LABEL} characters")
        if self.since_ms is not None and self.since_ms <= 0:
            raise BadInput("since must be a positive duration")
        if self.cursor is not None:
            decode_cursor(self.cursor)
        if self.trace_id is not None:
            trace_id = trace_filter(self.trace_id, "trace")
            if trace_id != self.trace_id:
                return replace(self, trace_id=trace_id)
        return self

    def matches(self, status: TaskStatus) -> bool:
        return ((self.state is None or status.state is self.state)
                and (self.agent_id is None or status.agent_id == self.agent_id)
                and (self.trace_id is None or status.trace_id == self.trace_id))


@dataclass
class TaskPage:
    tasks: list[TaskStatus]
    next_cursor: str | None
    """Pass it back for the next page; None when no older task is left."""
    scanned: int
    """How many task records this page read."""
    sources: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"tasks": [t.cli_dict() | {"trace_id": t.trace_id} for t in self.tasks],
                "next_cursor": self.next_cursor, "scanned": self.scanned}


def search_tasks(client: SyncRedis, settings: Settings, query: TaskQuery, budget: int = SCAN_BUDGET,
                 scripts: Scripts | None = None) -> TaskPage:
    """One page of the tasks `query` asks for, newest first."""
    query = query.checked()
    scripts = scripts or Scripts(client)
    cursor = decode_cursor(query.cursor) if query.cursor else None
    names = [query.capability] if query.capability else known_capabilities(client, settings)
    since = None
    if query.since_ms is not None and names:
        since = clock_of(client, CapabilityKeys(settings.prefix, names[0]).tasks) - query.since_ms
    walks, sources = [], []
    for name in names:
        source, walk = _candidates(client, scripts, settings, name, query.state, cursor, since)
        walks.append(walk)
        sources.append(f"{name}:{source}")
    merged = heapq.merge(*walks, key=lambda c: c.position, reverse=True)
    return _Page(scripts, settings, query, sources).read(merged, budget)


def _candidates(client: SyncRedis, scripts: Scripts, settings: Settings, capability: str,
                state: TaskState | None, cursor: Position | None, since: int | None
                ) -> tuple[str, Iterator[Candidate]]:
    keys = CapabilityKeys(settings.prefix, capability)
    if state is TaskState.FAILED:
        return "dlq", walk_dead_letters(scripts, settings, capability, cursor, since)
    if state is TaskState.CANCELED:
        return "canceled", walk_zset(client, keys.canceled, capability, cursor, since)
    if state in _LIVE:
        members = live_members(client, _LIVE[state], keys)
        if members is not None:
            return _LIVE[state], iter(order_live(client, keys.tasks, capability, members, cursor, since))
    return "index", walk_zset(client, keys.tasks, capability, cursor, since)


class _Page:
    """Reads candidates in batches, each run of one capability in one task_rows call, until
    the page is full, the budget spent or the candidates exhausted."""

    def __init__(self, scripts: Scripts, settings: Settings, query: TaskQuery, sources: list[str]) -> None:
        self.scripts = scripts
        self.settings = settings
        self.query = query
        self.sources = sources
        self.found: list[TaskStatus] = []
        self.scanned = 0

    def read(self, candidates: Iterator[Candidate], budget: int) -> TaskPage:
        size = min(max(2 * self.query.limit, 50), CHUNK)
        last: Candidate | None = None
        while self.scanned < budget:
            batch = list(itertools.islice(candidates, min(size, budget - self.scanned)))
            if not batch:
                return self._page(None)
            for run in _runs(batch):
                stopped = self._read_run(run)
                if stopped is not None:
                    return self._page(stopped)
            last = batch[-1]
            size = min(size * 4, CHUNK)
        # (the budget is spent: the next page goes on below the last record looked at)
        return self._page(last)

    def _read_run(self, run: list[Candidate]) -> Candidate | None:
        """Read one capability's run; the last match when the page filled up in it."""
        q = self.query
        want = q.limit - len(self.found)
        call = task_rows_call(self.settings, run[0].position.capability, [c.local_id for c in run],
                              ROW_FIELDS, state=q.state.value if q.state else "",
                              agent_id=q.agent_id or "", trace_id=q.trace_id or "", want=want)
        examined, matches = parse_task_rows(self.scripts(call))
        self.scanned += examined
        for _, values in matches:
            status = _status(values)
            if status is not None:
                self.found.append(status)
        return run[matches[-1][0]] if len(matches) >= want else None

    def _page(self, last: Candidate | None) -> TaskPage:
        return TaskPage(self.found, last.position.encode() if last else None, self.scanned, self.sources)


def _runs(batch: list[Candidate]) -> Iterator[list[Candidate]]:
    """The batch cut where the capability changes (a task_rows call reads one slot)."""
    for _, run in itertools.groupby(batch, key=lambda c: c.position.capability):
        yield list(run)


def _status(values: list[str | None]) -> TaskStatus | None:
    """The row of a record as task_rows read it; None for one that is no task's."""
    record = {name: value for name, value in zip(ROW_FIELDS, values, strict=True) if value is not None}
    if "id" not in record or "state" not in record:
        return None
    try:
        return TaskStatus.from_record(record)
    except (ValueError, KeyError):
        return None


def find_tasks(client: SyncRedis, settings: Settings, query: TaskQuery, scripts: Scripts | None = None
               ) -> TaskPage:
    """`query.limit` tasks, following pages as long as it takes (the CLI's answer: complete,
    however few tasks match; a page's `next_cursor` says where it stopped)."""
    scripts = scripts or Scripts(client)
    total = TaskPage([], query.cursor, 0)
    while True:
        want = query.limit - len(total.tasks)
        page = search_tasks(client, settings, replace(query, limit=want, cursor=total.next_cursor),
                            scripts=scripts)
        total = TaskPage(total.tasks + page.tasks, page.next_cursor, total.scanned + page.scanned,
                         page.sources)
        if page.next_cursor is None or len(total.tasks) >= query.limit:
            return total
