"""Dead-letter statistics: counts by capability and reason, oldest and newest, top errors.

Counted on the server page by page (dlq_stats.lua), so a stream of 100,000 entries sends
counters, not entries, to the client.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from dlq_tools.calls import parse_stats, stats_call
from dlq_tools.conn import Conn
from dlq_tools.parsing import iso_ms

STATS_BUDGET = 500
ERROR_CUT = 160


@dataclass(slots=True)
class CapabilityStats:
    capability: str
    total: int = 0
    by_reason: Counter[str] = field(default_factory=Counter)
    oldest_ms: int = 0
    newest_ms: int = 0

    def cli_dict(self) -> dict[str, Any]:
        return {"capability": self.capability, "total": self.total,
                "by_reason": dict(sorted(self.by_reason.items())),
                "oldest_dead_at": iso_ms(self.oldest_ms), "newest_dead_at": iso_ms(self.newest_ms)}


@dataclass(frozen=True, slots=True)
class ErrorCount:
    error: str
    count: int
    capabilities: list[str]


@dataclass(slots=True)
class Stats:
    capabilities: list[CapabilityStats]
    top_errors: list[ErrorCount]

    @property
    def total(self) -> int:
        return sum(c.total for c in self.capabilities)

    @property
    def by_reason(self) -> Counter[str]:
        out: Counter[str] = Counter()
        for c in self.capabilities:
            out.update(c.by_reason)
        return out

    @property
    def oldest_ms(self) -> int:
        return min((c.oldest_ms for c in self.capabilities if c.oldest_ms), default=0)

    @property
    def newest_ms(self) -> int:
        return max((c.newest_ms for c in self.capabilities), default=0)

    def cli_dict(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "by_reason": dict(sorted(self.by_reason.items())),
            "oldest_dead_at": iso_ms(self.oldest_ms),
            "newest_dead_at": iso_ms(self.newest_ms),
            "capabilities": [c.cli_dict() for c in self.capabilities],
            "top_errors": [{"error": e.error, "count": e.count, "capabilities": e.capabilities}
                           for e in self.top_errors],
        }


def collect(conn: Conn, capabilities: list[str], top: int = 10) -> Stats:
    out = []
    errors: Counter[str] = Counter()
    where: dict[str, set[str]] = {}
    for cap in capabilities:
        cs = CapabilityStats(cap)
        cursor = "-"
        while True:
            with conn.errors():
                page = parse_stats(conn.scripts(stats_call(conn.settings, cap, cursor, STATS_BUDGET,
                                                           ERROR_CUT)))
            cs.total += page.examined
            cs.by_reason.update(page.reasons)
            if page.oldest_ms and (not cs.oldest_ms or page.oldest_ms < cs.oldest_ms):
                cs.oldest_ms = page.oldest_ms
            cs.newest_ms = max(cs.newest_ms, page.newest_ms)
            for text, n in page.errors.items():
                errors[text] += n
                where.setdefault(text, set()).add(cap)
            if not page.cursor:
                break
            cursor = f"({page.cursor}"
        if cs.total:
            out.append(cs)
    ranked = sorted(errors.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    return Stats(out, [ErrorCount(text, n, sorted(where[text])) for text, n in ranked])
