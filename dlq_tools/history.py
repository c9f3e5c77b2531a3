"""A dead letter's attempts, read back from the task's event history (pure).

Every attempt starts with an `accepted` event (the agent took the task) and ends with
`retry_scheduled`, `succeeded`, `failed`, `reclaimed` (the lease lapsed or the agent restarted)
or `canceled`. A `failed` with no attempt running is a task that never started (it expired
while queued). `replayed` events start a new round: its attempts count from 1 again (unless the
replay kept the count), and `replay` says which round an attempt belongs to.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from dlq_tools.parsing import iso_ms


@dataclass(frozen=True, slots=True)
class Attempt:
    replay: int
    """0 for the attempts before any replay, n for those after the n-th replay."""
    attempt: int
    agent_id: str | None
    dispatched_at_ms: int | None
    started_at_ms: int | None
    ended_at_ms: int | None
    outcome: str
    """success, retryable_failure, a failure reason (failure, invalid_request, expired, ...),
    reclaimed, canceled, or running when the history ends mid-attempt."""
    error: str | None

    def cli_dict(self) -> dict[str, Any]:
        return {
            "replay": self.replay,
            "attempt": self.attempt,
            "agent_id": self.agent_id,
            "dispatched_at": iso_ms(self.dispatched_at_ms),
            "started_at": iso_ms(self.started_at_ms),
            "ended_at": iso_ms(self.ended_at_ms),
            "outcome": self.outcome,
            "error": self.error,
        }


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def attempts_from_history(events: list[dict[str, Any]]) -> list[Attempt]:
    """The attempts a task's events describe, in order."""
    out: list[Attempt] = []
    round_no = 0
    current: Attempt | None = None
    dispatched: tuple[str | None, int | None] | None = None

    def close(outcome: str, error: str | None, at: int | None) -> None:
        nonlocal current
        if current is not None:
            out.append(replace(current, outcome=outcome, error=error, ended_at_ms=at))
            current = None

    for event in events:
        kind = event.get("type")
        raw_data = event.get("data")
        data: dict[str, Any] = raw_data if isinstance(raw_data, dict) else {}
        at = _int(event.get("time"))
        agent = _text(event.get("agent_id"))
        if kind == "replayed":
            close("interrupted", None, at)
            round_no = _int(data.get("replay")) or round_no + 1
        elif kind == "dispatched":
            dispatched = (agent, at)
        elif kind == "accepted":
            close("reclaimed", "the agent restarted", at)
            sent = dispatched[1] if dispatched and dispatched[0] == agent else None
            current = Attempt(round_no, _int(event.get("attempt")) or 0, agent, sent, at, None,
                              "running", None)
            dispatched = None
        elif kind == "reclaimed":
            close("reclaimed", _text(data.get("reason")), at)
        elif kind == "retry_scheduled":
            close("retryable_failure", _text(data.get("error")), at)
        elif kind == "succeeded":
            close("success", None, at)
        elif kind == "canceled":
            close("canceled", None, at)
        elif kind == "failed":
            reason = _text(data.get("reason")) or "failure"
            if current is None:
                out.append(Attempt(round_no, _int(event.get("attempt")) or 0, agent,
                                   dispatched[1] if dispatched else None, None, at, reason,
                                   _text(data.get("error"))))
            else:
                close(reason, _text(data.get("error")), at)
    if current is not None:
        out.append(current)
    return out
