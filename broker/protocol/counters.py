"""A capability's counters as the scripts keep them in its stats hash (broker/keys.py note (8)):
exact, each changed once per script call, never sampled. The metrics, and anyone who wants
the numbers, read them through parse_counters."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from broker.keys import (
    STAT_DIRECT,
    STAT_FINISHED,
    STAT_LATE_RESULTS,
    STAT_PULLED,
    STAT_RECLAIMS,
    STAT_REMOVED,
    STAT_REROUTES,
    STAT_RETRIES,
    STAT_ROUTED,
    STAT_SUBMITTED,
    finished_field,
)

OUTCOMES = ("succeeded", "failed", "canceled")


@dataclass(frozen=True, slots=True)
class Counters:
    submitted: int = 0
    direct: int = 0
    """Tasks a submit handed straight to an agent (by a grant)."""
    routed: int = 0
    """Tasks a dispatcher's round handed to an agent."""
    pulled: int = 0
    """Tasks an agent's completion took from the queue (a standing pull)."""
    finished: dict[tuple[str, str], int] = field(default_factory=dict)
    """(outcome, reason) -> tasks that ended so; reason '' for succeeded and canceled."""
    retries: int = 0
    reclaims: int = 0
    reroutes: int = 0
    late_results: int = 0
    removed: int = 0

    @property
    def dispatched(self) -> int:
        """Tasks put in an inbox, however."""
        return self.direct + self.routed + self.pulled

    @property
    def active(self) -> int:
        """Tasks in the capability's inboxes (dispatched or running), as the scripts count them
        (max_running is held against it; the lease sweep sets it exactly)."""
        return self.dispatched - self.finished.get(("succeeded", ""), 0) - self.removed


_PLAIN = {STAT_SUBMITTED: "submitted", STAT_DIRECT: "direct", STAT_ROUTED: "routed",
          STAT_PULLED: "pulled", STAT_RETRIES: "retries", STAT_RECLAIMS: "reclaims",
          STAT_REROUTES: "reroutes", STAT_LATE_RESULTS: "late_results", STAT_REMOVED: "removed"}


def _int(text: str | bytes | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def parse_counters(raw: Mapping[str, str]) -> Counters:
    """The counters of a stats hash (HGETALL); fields that are no counter are left out."""
    values: dict[str, int] = {}
    finished: dict[tuple[str, str], int] = {}
    for name, text in raw.items():
        number = _int(text)
        if number is None:
            continue
        if name in _PLAIN:
            values[_PLAIN[name]] = number
        elif name.startswith(STAT_FINISHED):
            outcome, sep, reason = name[len(STAT_FINISHED):].partition(":")
            if sep and outcome in OUTCOMES:
                finished[(outcome, reason)] = number
    return Counters(finished=finished, **values)


__all__ = ["OUTCOMES", "Counters", "finished_field", "parse_counters"]
