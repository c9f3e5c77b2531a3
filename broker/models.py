"""The shapes that cross process boundaries: task status, events, agent descriptors.

Records are versioned (`v`) and every model ignores fields it does not know, so a newer
producer and an older worker (or the other way round) can share one Redis: new fields are only
ever added, with defaults.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from broker import codec
from broker.protocol.trace import trace_id_of

SCHEMA_VERSION = 1


class TaskState(StrEnum):
    SCHEDULED = "scheduled"
    """Waiting for its start time (a delay or a time given at submit)."""
    QUEUED = "queued"
    DISPATCHED = "dispatched"
    RUNNING = "running"
    RETRYING = "retrying"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL = frozenset({TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELED})


class FailureReason(StrEnum):
    RETRIES_EXHAUSTED = "retries_exhausted"
    INVALID_REQUEST = "invalid_request"
    FAILURE = "failure"
    EXPIRED = "expired"
    MALFORMED = "malformed"
    BAD_RESULT = "bad_result"
    NO_AGENT_TIMEOUT = "no_agent_timeout"


class Outcome(StrEnum):
    """How one attempt ended, as the worker reports it (the seeds' business status)."""

    SUCCESS = "success"
    INVALID_REQUEST = "invalid_request"
    FAILURE = "failure"
    RETRYABLE_FAILURE = "retryable_failure"
    BAD_RESULT = "bad_result"


class EventType(StrEnum):
    SCHEDULED = "scheduled"
    QUEUED = "queued"
    DISPATCHED = "dispatched"
    ACCEPTED = "accepted"
    PROGRESS = "progress"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    RETRY_SCHEDULED = "retry_scheduled"
    RECLAIMED = "reclaimed"
    DEAD_LETTERED = "dead_lettered"
    CANCELED = "canceled"
    EXPIRED = "expired"
    REPLAYED = "replayed"
    LATE_RESULT_REJECTED = "late_result_rejected"


# The events after which a task's stream has nothing more to say.
TERMINAL_EVENTS = frozenset({EventType.SUCCEEDED, EventType.DEAD_LETTERED, EventType.CANCELED})


def ms_to_datetime(value: str | int | None) -> datetime | None:
    if value in (None, "", "0", 0):
        return None
    return datetime.fromtimestamp(int(value) / 1000, tz=UTC)


class TaskStatus(BaseModel):
    """A snapshot of one task, as `h.status()` and `reach status` show it."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    task_id: str
    capability: str
    state: TaskState
    priority: int = 5
    attempt: int = 0
    max_attempts: int | None = None
    """The task's own limit (None: its capability's policy decides)."""
    agent_id: str | None = None
    created_at: datetime | None = None
    dispatched_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    deadline_at: datetime | None = None
    due_at: datetime | None = None
    """A scheduled task's start time."""
    reason: str | None = None
    error: str | None = None
    session_id: str | None = None
    region: str | None = None
    trace_id: str | None = None
    """The W3C trace id (32 hex) of the task's traceparent."""
    progress_dropped: int = 0
    """Progress events dropped to keep the latest max_progress_events."""

    @classmethod
    def from_record(cls, record: dict[str, str]) -> TaskStatus:
        return cls(
            task_id=record["id"],
            capability=record.get("cap", ""),
            state=TaskState(record["state"]),
            priority=int(record.get("priority") or 5),
            attempt=int(record.get("attempt") or 0),
            max_attempts=int(record["max_attempts"]) if record.get("max_attempts") else None,
            agent_id=record.get("agent_id") or None,
            created_at=ms_to_datetime(record.get("created_at")),
            dispatched_at=ms_to_datetime(record.get("dispatched_at")),
            started_at=ms_to_datetime(record.get("started_at")),
            finished_at=ms_to_datetime(record.get("finished_at")),
            deadline_at=ms_to_datetime(record.get("deadline_at")),
            due_at=ms_to_datetime(record.get("due_at")),
            reason=record.get("reason") or None,
            error=record.get("error") or None,
            session_id=record.get("session_id") or None,
            region=record.get("region") or None,
            trace_id=trace_id_of(record.get("trace")),
            progress_dropped=int(record.get("progress_dropped") or 0),
        )

    def cli_dict(self) -> dict[str, Any]:
        """The fields `--json` promises for a task, in order."""
        return {
            "task_id": self.task_id,
            "capability": self.capability,
            "state": self.state.value,
            "priority": self.priority,
            "attempt": self.attempt,
            "agent_id": self.agent_id,
            "created_at": _iso(self.created_at),
            "finished_at": _iso(self.finished_at),
            "reason": self.reason,
            "error": self.error,
            "trace_id": self.trace_id,
            "progress_dropped": self.progress_dropped,
        }


class TaskEvent(BaseModel):
    """One entry of a task's event stream."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    seq: int
    type: str
    task_id: str
    attempt: int = 0
    agent_id: str | None = None
    trace_id: str | None = None
    time: datetime
    data: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def from_json(cls, text: str) -> TaskEvent:
        raw = codec.loads(text)
        raw["time"] = ms_to_datetime(raw.get("time")) or datetime.now(UTC)
        return cls.model_validate(raw)

    @classmethod
    def from_compact(cls, seq: int, text: str, task_id: str, trace_id: str | None) -> TaskEvent:
        """An event as the task record stores it: `type|time ms|attempt|agent id|data JSON`
        (see broker/lua/_events.lua); ValueError when it is not one."""
        parts = text.split("|", 4)
        if len(parts) != 5:
            raise ValueError(f"not an event: {text[:80]!r}")
        etype, time_ms, attempt, agent, data = parts
        parsed = codec.loads(data)
        return cls(seq=seq, type=etype, task_id=task_id, attempt=int(attempt or 0),
                   agent_id=agent or None, trace_id=trace_id or None,
                   time=ms_to_datetime(time_ms) or datetime.now(UTC),
                   data=parsed if isinstance(parsed, dict) else {})

    def as_dict(self) -> dict[str, Any]:
        """The event as JSON-ready data, time in ms (the layout of dead letters' histories)."""
        return {"seq": self.seq, "type": self.type, "task_id": self.task_id, "attempt": self.attempt,
                "agent_id": self.agent_id, "trace_id": self.trace_id,
                "time": round(self.time.timestamp() * 1000), "data": self.data}

    @property
    def terminal(self) -> bool:
        return self.type in TERMINAL_EVENTS


class AgentDescriptor(BaseModel):
    """What an agent says about itself when it registers."""

    model_config = ConfigDict(extra="ignore")

    v: int = SCHEMA_VERSION
    agent_id: str
    capabilities: list[str]
    max_concurrency: int = Field(8, ge=1)
    region: str | None = None
    version: str | None = None
    warmup_s: float = Field(0.0, ge=0)
    labels: dict[str, str] = Field(default_factory=dict)
    host: str | None = None
    pid: int | None = None


MAX_DESCRIPTION_BYTES = 65536
"""Most JSON one capability's description may take (schemas included): the registry is read
by every gateway that lists tools, so a description stays small."""


class CapabilityDescription(BaseModel):
    """What a capability does and takes, for people and for the agent protocols (an A2A skill,
    an MCP tool): registered by the agents that serve it (`reach capabilities` lists them)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    description: str | None = Field(None, max_length=4000)
    input_schema: dict[str, Any] | None = None
    """The JSON Schema of the payload (a pydantic payload model's, or given)."""
    output_schema: dict[str, Any] | None = None
    """The JSON Schema of the result."""
    examples: list[Any] = Field(default_factory=list, max_length=20)
    """Example payloads."""

    @property
    def empty(self) -> bool:
        return not (self.description or self.input_schema or self.output_schema or self.examples)

    def merged(self, over: CapabilityDescription) -> CapabilityDescription:
        """This description with every field `over` gives replaced."""
        return self.model_copy(update=over.model_dump(exclude_defaults=True))


def described_json(descriptions: dict[str, CapabilityDescription]) -> str:
    """The registry's `described` field for these descriptions ('' when none says anything)."""
    kept = {name: d.model_dump(exclude_defaults=True) for name, d in descriptions.items() if not d.empty}
    return codec.dumps(kept) if kept else ""


def parse_described(text: str | None) -> dict[str, CapabilityDescription]:
    """The descriptions a registry record holds (those that do not parse are left out)."""
    try:
        raw = codec.loads(text) if text else {}
    except (ValueError, RecursionError):
        return {}
    out: dict[str, CapabilityDescription] = {}
    for name, value in (raw.items() if isinstance(raw, dict) else ()):
        try:
            out[str(name)] = CapabilityDescription.model_validate(value)
        except ValueError:
            continue
    return out


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None
