"""The dead-letter tools as a Python API; `reach dlq` is a thin layer over it.

    from dlq_tools import DeadLetters, Filter
    with DeadLetters(settings) as dlq:
        page = dlq.list(Filter(reason="failure"), limit=20)
        detail = dlq.get(page.items[0].ref)
        report = dlq.replay(dlq.select(filter=Filter(capability="summarize")))

Listing is newest first across every capability of the registry (or the one a filter names);
`select` snapshots what a bulk operation covers, oldest first, so that tasks which fail again
during a replay are not replayed a second time by the same run.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from broker.errors import BadInput
from broker.ids import split_task_id
from broker.infra.connection import SyncRedis
from broker.settings import Settings
from dlq_tools import replay as replay_mod
from dlq_tools import stats as stats_mod
from dlq_tools import transfer
from dlq_tools.conn import Conn
from dlq_tools.models import DeadLetter, DeadLetterDetail, Filter, Outcome, Report, Target, UnknownDeadLetter
from dlq_tools.parsing import Ref, entry_key, parse_ref
from dlq_tools.scan import read_entry, scan

# A task cannot die before it was made; its id's time comes from the producer's clock, so the
# search for a task id starts this much earlier than that.
_CLOCK_SKEW_MS = 86_400_000
_PURGE_CHUNK = 500


@dataclass(frozen=True, slots=True)
class Page:
    items: list[DeadLetter]
    next_before: str | None
    """Pass as `before` for the next page (None: this was the last one)."""


class DeadLetters:
    """Inspect, replay, purge, export and import the dead-letter streams of one Reach deployment."""

    def __init__(self, settings: Settings | None = None, *, redis_client: SyncRedis | None = None) -> None:
        self.conn = Conn(settings or Settings.load(), redis_client)
        self.settings = self.conn.settings

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> DeadLetters:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def now_ms(self) -> int:
        return self.conn.now_ms()

    def _capabilities(self, f: Filter | None) -> builtins.list[str]:
        if f is not None and f.capability:
            return [f.capability]
        return self.conn.capabilities()

    # -- reading ----------------------------------------------------------------------------

    def list(self, f: Filter | None = None, *, limit: int = 50, before: str | None = None) -> Page:
        """One page of matching dead letters, newest first (ties: capability, descending)."""
        f = f or Filter()
        if not 1 <= limit <= 10_000:
            raise BadInput(f"limit must be from 1 to 10000, got {limit}")
        cursor = _cursor(before)
        rows: list[DeadLetter] = []
        for cap in self._capabilities(f):
            after, inclusive = None, False
            if cursor is not None:
                after, inclusive = cursor.entry_id, cap < cursor.capability
            for entry_id, fields in scan(self.conn, cap, f, newest_first=True, mode="summary",
                                         after=after, inclusive=inclusive, limit=limit + 1):
                rows.append(DeadLetter.from_fields(cap, entry_id, fields))
        rows.sort(key=lambda d: (entry_key(d.entry_id), d.capability), reverse=True)
        items = rows[:limit]
        return Page(items, items[-1].entry if len(rows) > limit else None)

    def iter(self, f: Filter | None = None) -> Iterator[DeadLetter]:
        """Every matching dead letter, capability by capability, oldest first."""
        for cap in self._capabilities(f):
            for entry_id, fields in scan(self.conn, cap, f or Filter(), newest_first=False, mode="summary"):
                yield DeadLetter.from_fields(cap, entry_id, fields)

    def locate(self, ref: str | Ref) -> Target:
        """Where a dead letter is; UnknownDeadLetter when no stream holds it."""
        ref = parse_ref(ref) if isinstance(ref, str) else ref
        if ref.entry_id is not None:
            fields = read_entry(self.conn, ref.capability, ref.entry_id)
            if fields is None:
                raise UnknownDeadLetter(ref)
            return Target(ref.capability, ref.entry_id, fields.get("task_id") or None,
                          fields.get("reason", ""))
        assert ref.task_id is not None
        for f, newest_id in self._task_windows(ref):
            for entry_id, fields in scan(self.conn, ref.capability, f, newest_first=True, mode="ids",
                                         after=newest_id, inclusive=True, limit=1, task_id=ref.task_id):
                return Target(ref.capability, entry_id, ref.task_id, fields.get("reason", ""))
        raise UnknownDeadLetter(ref)

    def _task_windows(self, ref: Ref) -> builtins.list[tuple[Filter, str | None]]:
        """Where to look for a task's entry, as (filter, newest entry id to start from): around
        the end its record notes first (entry ids are the server time of dead-lettering), then
        everything since the task was made."""
        assert ref.task_id is not None
        local = split_task_id(ref.task_id)[1]
        with self.conn.errors():
            finished = self.conn.redis.hget(self.conn.keys(ref.capability).task(local), "finished_at")
        windows: builtins.list[tuple[Filter, str | None]] = []
        if finished and finished.isdigit() and int(finished) > 0:
            windows.append((Filter(since_ms=int(finished) - 60_000), f"{int(finished) + 60_000}-0"))
        windows.append((Filter(since_ms=max(1, _ulid_ms(local) - _CLOCK_SKEW_MS)), None))
        return windows

    def get(self, ref: str | Ref) -> DeadLetterDetail:
        """A dead letter with the task's record, payload, attempts and events."""
        target = self.locate(ref)
        fields = read_entry(self.conn, target.capability, target.entry_id)
        if fields is None:
            raise UnknownDeadLetter(ref)
        return DeadLetterDetail.from_fields(target.capability, target.entry_id, fields)

    def stats(self, capability: str | None = None, *, top: int = 10) -> stats_mod.Stats:
        """Counts by capability and reason, oldest and newest, the most frequent errors."""
        return stats_mod.collect(self.conn, self._capabilities(Filter(capability=capability)), top)

    # -- choosing what a bulk operation covers ----------------------------------------------

    def select(self, refs: Sequence[str] = (), *, f: Filter | None = None, everything: bool = False
               ) -> builtins.list[Target]:
        """The dead letters named by `refs`, or matching `f`, or all (`everything`, of
        `f.capability` if set); ids and filters never mix.

        Named ones must all exist (UnknownDeadLetter names the first that does not). A filter's
        matches are a snapshot taken now, oldest first.
        """
        f = f or Filter()
        if refs and (everything or not f.empty):
            raise BadInput("conflicting selection: give dead-letter ids, or --all/filters, not both")
        if everything and f.narrows:
            raise BadInput("conflicting selection: --all takes no filter but --capability")
        if not refs and not everything and f.empty:
            raise BadInput("nothing selected: give dead-letter ids, --all, or a filter "
                           "(--capability, --reason, ...)")
        if refs:
            parsed = [parse_ref(r) for r in refs]
            seen: dict[str, Target] = {}
            for ref in parsed:
                target = self.locate(ref)
                seen.setdefault(target.entry, target)
            return list(seen.values())
        out: builtins.list[Target] = []
        for cap in self._capabilities(f):
            for entry_id, fields in scan(self.conn, cap, f, newest_first=False, mode="ids"):
                out.append(Target(cap, entry_id, fields.get("task_id") or None, fields.get("reason", "")))
        return out

    # -- changing ---------------------------------------------------------------------------

    def replay(self, targets: Iterable[Target], options: replay_mod.ReplayOptions | None = None,
               on_outcome: Callable[[Outcome], None] | None = None) -> Report:
        """Requeue each dead letter's task (see dlq_tools.replay), paced, atomically per entry."""
        return replay_mod.replay(self.conn, list(targets), options or replay_mod.ReplayOptions(),
                                 on_outcome)

    def purge(self, targets: Iterable[Target], *, dry_run: bool = False,
              on_outcome: Callable[[Outcome], None] | None = None) -> Report:
        """Delete dead letters for good (each XDEL is atomic; ones already gone say so)."""
        chosen = list(targets)
        report = Report("purge", dry_run, selected=len(chosen))
        for start in range(0, len(chosen), _PURGE_CHUNK):
            chunk = chosen[start : start + _PURGE_CHUNK]
            if dry_run:
                deleted = [1] * len(chunk)
            else:
                with self.conn.errors():
                    pipe = self.conn.redis.pipeline(transaction=False)
                    for t in chunk:
                        pipe.xdel(self.conn.keys(t.capability).dlq, t.entry_id)
                    deleted = pipe.execute()
            for t, n in zip(chunk, deleted, strict=True):
                status = ("would_purge" if dry_run else "purged") if int(n) else "gone"
                outcome = Outcome(t, status)
                report.outcomes.append(outcome)
                if on_outcome:
                    on_outcome(outcome)
        return report

    def export(self, path: Path | str, f: Filter | None = None) -> int:
        """Write matching dead letters to a JSON-lines file, oldest first; returns how many."""
        return transfer.export(self.conn, self._capabilities(f), f or Filter(), Path(path))

    def import_(self, path: Path | str, *, dry_run: bool = False) -> transfer.ImportResult:
        """Add the dead letters of an export file, skipping those already here."""
        return transfer.import_file(self.conn, Path(path), dry_run=dry_run)


def _cursor(before: str | None) -> Ref | None:
    if before is None:
        return None
    ref = parse_ref(before)
    if ref.entry_id is None:
        raise BadInput(
            f"invalid --before {before!r}: pass the `entry` of the last row shown "
            "('<capability>/<stream entry id>')"
        )
    return ref


_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def _ulid_ms(local_id: str) -> int:
    """The millisecond time a ULID starts with."""
    value = 0
    for ch in local_id[:10]:
        value = value * 32 + _CROCKFORD.index(ch)
    return value
