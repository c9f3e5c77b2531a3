"""The shapes of the dead-letter tools: a filter, a dead letter, its details, and what replay,
purge and import report. `cli_dict()` gives each one's documented `--json` form (docs/dlq.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from broker.errors import BadInput, ReachError
from broker.ids import check_capability
from broker.protocol.trace import trace_id_of
from dlq_tools.history import Attempt, attempts_from_history
from dlq_tools.parsing import Ref, check_reason, iso_ms

# Fields every dead-letter object of `--json` starts with, in this order (DESIGN.md).
CONTRACT_FIELDS = ("task_id", "capability", "reason", "attempts", "error", "dead_at", "last_agent_id")


class UnknownDeadLetter(ReachError, LookupError):
    """No dead letter has this id (never dead-lettered, or replayed, purged or trimmed since)."""

    def __init__(self, ref: Ref | str) -> None:
        super().__init__(
            f"no dead letter {str(ref)!r} in the DLQ (never dead-lettered, or replayed, purged or "
            "trimmed since)"
        )
        self.ref = str(ref)


@dataclass(frozen=True, slots=True)
class Filter:
    """Which dead letters an operation covers. Every field that is set must match.

    `since_ms` keeps those dead at or after it, `until_ms` those dead before it (server ms).
    """

    capability: str | None = None
    reason: str | None = None
    agent: str | None = None
    since_ms: int | None = None
    until_ms: int | None = None

    def __post_init__(self) -> None:
        if self.capability is not None:
            check_capability(self.capability)
        if self.reason is not None:
            check_reason(self.reason)
        if self.agent is not None and not self.agent:
            raise BadInput("--agent must not be empty")
        if self.since_ms is not None and self.until_ms is not None and self.since_ms >= self.until_ms:
            raise BadInput(
                f"conflicting filters: the start ({iso_ms(self.since_ms)}) is not before the end "
                f"({iso_ms(self.until_ms)}), so nothing could match"
            )

    @property
    def narrows(self) -> bool:
        """Whether anything but the capability is filtered on."""
        return any(v is not None for v in (self.reason, self.agent, self.since_ms, self.until_ms))

    @property
    def empty(self) -> bool:
        return self.capability is None and not self.narrows


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One entry of a capability's dead-letter stream, without the task's record and history."""

    capability: str
    entry_id: str
    task_id: str | None
    reason: str
    error: str | None
    attempts: int
    dead_at_ms: int
    last_agent_id: str | None
    source: str | None = None
    imported_from: str | None = None

    @classmethod
    def from_fields(cls, capability: str, entry_id: str, fields: dict[str, str]) -> DeadLetter:
        return cls(
            capability=capability,
            entry_id=entry_id,
            task_id=fields.get("task_id") or None,
            reason=fields.get("reason") or "failure",
            error=fields.get("error") or None,
            attempts=_int(fields.get("attempts")),
            dead_at_ms=_int(fields.get("dead_at")),
            last_agent_id=fields.get("last_agent_id") or None,
            source=fields.get("source") or None,
            imported_from=fields.get("imported_from") or None,
        )

    @property
    def entry(self) -> str:
        """The address that always works: `<capability>/<stream entry id>`."""
        return f"{self.capability}/{self.entry_id}"

    @property
    def ref(self) -> str:
        """What to pass back to show/replay/purge: the task id, else the entry address."""
        return self.task_id or self.entry

    def cli_dict(self, now_ms: int) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "capability": self.capability,
            "reason": self.reason,
            "attempts": self.attempts,
            "error": self.error,
            "dead_at": iso_ms(self.dead_at_ms),
            "last_agent_id": self.last_agent_id,
            "entry": self.entry,
            "age_s": round(max(0, now_ms - self.dead_at_ms) / 1000, 3),
        }


@dataclass(frozen=True, slots=True)
class DeadLetterDetail:
    """A dead letter with everything it holds: the task's record, its events, raw fields."""

    letter: DeadLetter
    record: dict[str, str]
    events: list[dict[str, Any]]
    raw: dict[str, Any] | None = None

    @classmethod
    def from_fields(cls, capability: str, entry_id: str, fields: dict[str, str]) -> DeadLetterDetail:
        record = _json(fields.get("record"), {})
        events = _json(fields.get("history"), [])
        raw = _json(fields.get("raw"), None) if "raw" in fields else None
        return cls(
            letter=DeadLetter.from_fields(capability, entry_id, fields),
            record={str(k): str(v) for k, v in record.items()} if isinstance(record, dict) else {},
            events=[e for e in events if isinstance(e, dict)] if isinstance(events, list) else [],
            raw=raw if isinstance(raw, dict) else ({"text": fields["raw"]} if "raw" in fields else None),
        )

    @property
    def attempt_history(self) -> list[Attempt]:
        return attempts_from_history(self.events)

    @property
    def payload_text(self) -> str | None:
        return self.record.get("payload")

    def payload(self) -> Any:
        """The payload as a JSON value (its text when it does not parse)."""
        text = self.payload_text
        if text is None:
            return None
        try:
            return json.loads(text)
        except ValueError:
            return text

    def envelope(self) -> dict[str, Any]:
        r = self.record
        meta = _json(r.get("metadata"), None) if r.get("metadata") else None
        return {
            "priority": _opt_int(r.get("priority")),
            "session_id": r.get("session_id") or None,
            "region": r.get("region") or None,
            "idempotency_key": r.get("idempotency_key") or None,
            "timeout_ms": _opt_int(r.get("timeout_ms")),
            "deadline_at": iso_ms(_int(r.get("deadline_at"))),
            "max_attempts": _opt_int(r.get("max_attempts")),
            "metadata": meta,
            "created_at": iso_ms(_int(r.get("created_at"))),
            "fence": _opt_int(r.get("fence")),
            "replays": _int(r.get("replays")),
        }

    def cli_dict(self, now_ms: int) -> dict[str, Any]:
        out = self.letter.cli_dict(now_ms)
        out.update({
            "trace_id": trace_id_of(self.record.get("trace")),
            "envelope": self.envelope(),
            "payload": self.payload(),
            "payload_bytes": len(self.payload_text.encode()) if self.payload_text else 0,
            "attempt_history": [a.cli_dict() for a in self.attempt_history],
            "events": self.events,
            "raw": self.raw,
            "source": self.letter.source,
            "imported_from": self.letter.imported_from,
        })
        return out


@dataclass(frozen=True, slots=True)
class Target:
    """A dead letter chosen for replay or purge (what is needed to act on it)."""

    capability: str
    entry_id: str
    task_id: str | None
    reason: str

    @property
    def entry(self) -> str:
        return f"{self.capability}/{self.entry_id}"

    @property
    def ref(self) -> str:
        return self.task_id or self.entry


@dataclass
class Outcome:
    """What happened (or, in a dry run, would happen) to one dead letter."""

    target: Target
    status: str
    detail: str = ""

    def cli_dict(self) -> dict[str, Any]:
        return {"task_id": self.target.task_id, "capability": self.target.capability,
                "entry": self.target.entry, "reason": self.target.reason, "status": self.status,
                "detail": self.detail or None}


@dataclass
class Report:
    """The result of a replay or purge: every entry's outcome, and counts by status."""

    action: str
    dry_run: bool
    selected: int = 0
    outcomes: list[Outcome] = field(default_factory=list)
    stopped: str | None = None
    """Why the run stopped before the end (e.g. the queue is full), if it did."""

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for o in self.outcomes:
            out[o.status] = out.get(o.status, 0) + 1
        return out

    def done(self, status: str) -> int:
        return sum(1 for o in self.outcomes if o.status == status)

    def cli_dict(self) -> dict[str, Any]:
        return {"action": self.action, "dry_run": self.dry_run, "selected": self.selected,
                "counts": self.counts(), "stopped": self.stopped,
                "items": [o.cli_dict() for o in self.outcomes]}


def _int(value: object) -> int:
    try:
        return int(str(value)) if value not in (None, "") else 0
    except ValueError:
        return 0


def _opt_int(value: object) -> int | None:
    return _int(value) if value not in (None, "") else None


def _json(text: str | None, default: Any) -> Any:
    if not text:
        return default
    try:
        return json.loads(text)
    except ValueError:
        return default
