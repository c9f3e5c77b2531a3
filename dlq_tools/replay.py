"""Replaying dead letters: back through the normal path, atomically per entry, paced.

Each script call (dlq_replay.lua) requeues a batch of tasks of one capability and deletes their
dead-letter entries in the same atomic step, so a replay killed at any moment has replayed
some entries completely and left the others untouched in the DLQ: none lost, none queued twice.
Running it again picks up exactly the ones left.

Replaying thousands of failures at once is how retry storms start, so a replay is paced: at
most `rate` tasks per second on average (in batches of `batch`), and it waits while the
capability's ready queue already holds `max_queued` tasks (the agents are not keeping up).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import groupby

from broker import codec
from broker.errors import BadInput, InvalidPriority
from broker.ids import split_task_id
from dlq_tools.calls import ReplayItem, parse_replay, replay_call
from dlq_tools.conn import Conn
from dlq_tools.models import Outcome, Report, Target

DEFAULT_RATE = 50.0
DEFAULT_BATCH = 25
DEFAULT_MAX_QUEUED = 1000
QUEUE_POLL_S = 0.25


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    priority: int | None = None
    """Run the replayed tasks at this priority (0-9) instead of their own."""
    reset_attempts: bool = True
    """Start the attempt count afresh (the default), or keep it (one more try only)."""
    rate: float = DEFAULT_RATE
    """Most tasks requeued per second, on average."""
    batch: int = DEFAULT_BATCH
    """Tasks requeued per script call."""
    max_queued: int = DEFAULT_MAX_QUEUED
    """Wait while the capability's ready queue holds this many tasks (0: never wait)."""
    dry_run: bool = False

    def __post_init__(self) -> None:
        p = self.priority
        if p is not None and (isinstance(p, bool) or not isinstance(p, int) or not 0 <= p <= 9):
            raise InvalidPriority(f"priority must be an int from 0 to 9 (higher runs first), got {p!r}")
        if not 0 < self.rate <= 100_000:
            raise BadInput(f"rate must be more than 0 and at most 100000 tasks per second, got {self.rate}")
        if not 1 <= self.batch <= 1000:
            raise BadInput(f"batch must be from 1 to 1000, got {self.batch}")
        if self.max_queued < 0:
            raise BadInput(f"max-queued must be 0 (no limit) or more, got {self.max_queued}")


class Pacer:
    """Spaces batches so that on average no more than `rate` items per second go out."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.rate = rate
        self._clock = clock
        self._sleep = sleep
        self._next: float | None = None

    def wait(self, n: int) -> float:
        """Block until `n` more items may go; returns how long it slept."""
        now = self._clock()
        slept = 0.0
        if self._next is not None and self._next > now:
            slept = self._next - now
            self._sleep(slept)
            now = self._next
        self._next = now + n / self.rate
        return slept


def history_lines(history: str | None) -> str:
    """A dead letter's history field as event JSON texts, one per line (for dlq_replay.lua)."""
    try:
        events = json.loads(history or "[]")
    except ValueError:
        return ""
    if not isinstance(events, list):
        return ""
    return "\n".join(codec.dumps(e) for e in events if isinstance(e, dict))


def replay(conn: Conn, targets: list[Target], options: ReplayOptions,
           on_outcome: Callable[[Outcome], None] | None = None) -> Report:
    report = Report("replay", options.dry_run, selected=len(targets))
    pacer = Pacer(options.rate)

    def record(outcome: Outcome) -> None:
        report.outcomes.append(outcome)
        if on_outcome:
            on_outcome(outcome)

    try:
        _run(conn, targets, options, pacer, report, record)
    except KeyboardInterrupt:
        report.stopped = ("interrupted; a batch in flight may have been replayed without being "
                          "reported: run the same replay again to finish")
    return report


def _run(conn: Conn, targets: list[Target], options: ReplayOptions, pacer: Pacer, report: Report,
         record: Callable[[Outcome], None]) -> None:
    for capability, group in groupby(targets, key=lambda t: t.capability):
        chosen = list(group)
        for start in range(0, len(chosen), options.batch):
            chunk = chosen[start : start + options.batch]
            if options.dry_run:
                for outcome in _preview(conn, chunk, options):
                    record(outcome)
                continue
            replayable = [t for t in chunk if t.task_id]
            statuses: list[tuple[str, str]] = []
            if replayable:
                _wait_for_room(conn, capability, options.max_queued)
                pacer.wait(len(replayable))
                statuses = _replay_batch(conn, capability, replayable, options)
            done = dict(zip((t.entry_id for t in replayable), statuses, strict=True))
            for t in chunk:
                status, detail = done.get(t.entry_id, ("malformed", ""))
                record(Outcome(t, status, _describe(status, detail)))
            full = [d for s, d in statuses if s == "full"]
            if full:
                report.stopped = (f"the ready queue of {capability!r} is full (depth {full[0]}, "
                                  f"max_queue_depth {conn.settings.max_queue_depth})")
                return


def _replay_batch(conn: Conn, capability: str, chunk: list[Target], options: ReplayOptions
                  ) -> list[tuple[str, str]]:
    dlq = conn.keys(capability).dlq
    with conn.errors():
        pipe = conn.redis.pipeline(transaction=False)
        for t in chunk:
            pipe.xrange(dlq, t.entry_id, t.entry_id)
        found = pipe.execute()
    items = []
    for t, entries in zip(chunk, found, strict=True):
        history = dict(entries[0][1]).get("history") if entries else None
        items.append(ReplayItem(t.entry_id, t.task_id or "", history_lines(history)))
    call = replay_call(conn.settings, capability, items, priority=options.priority,
                       reset_attempts=options.reset_attempts)
    with conn.errors():
        return parse_replay(conn.scripts(call))


def _preview(conn: Conn, chunk: list[Target], options: ReplayOptions) -> list[Outcome]:
    """What replaying would do, read without changing anything."""
    with conn.errors():
        pipe = conn.redis.pipeline(transaction=False)
        for t in chunk:
            local = split_task_id(t.task_id)[1] if t.task_id else "-"
            pipe.hmget(conn.keys(t.capability).task(local), "state", "priority")
        replies = pipe.execute()
    out = []
    for t, (state, priority) in zip(chunk, replies, strict=True):
        if not t.task_id:
            out.append(Outcome(t, "malformed", "a raw entry has no task to replay"))
        elif state and state != "failed":
            out.append(Outcome(t, "active", f"the task is {state} already; left alone"))
        else:
            p = options.priority if options.priority is not None else priority or "its own"
            attempts = "attempts reset" if options.reset_attempts else "attempts kept"
            rebuilt = "" if state else "; record rebuilt from the dead letter"
            out.append(Outcome(t, "would_replay", f"queued at priority {p}, {attempts}{rebuilt}"))
    return out


def _wait_for_room(conn: Conn, capability: str, max_queued: int) -> None:
    if max_queued <= 0:
        return
    queue = conn.keys(capability).queue
    while True:
        with conn.errors():
            depth = int(conn.redis.zcard(queue))
        if depth < max_queued:
            return
        time.sleep(QUEUE_POLL_S)


def _describe(status: str, detail: str) -> str:
    if status == "replayed":
        return f"queued at priority {detail}"
    if status == "active":
        return f"the task is {detail} already; left alone"
    if status == "full":
        return f"the ready queue is full (depth {detail}); left in the DLQ"
    if status == "gone":
        return "no longer in the DLQ (replayed or purged meanwhile)"
    if status == "malformed":
        return "a raw entry has no task to replay"
    if status == "mismatch":
        return "the entry holds another task"
    if status == "corrupt":
        return "the task's record is gone and the dead letter's copy is unusable; left in the DLQ"
    return detail
