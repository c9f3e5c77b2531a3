"""The agent health hash of a capability, as complete.lua and reclaim.lua keep it (see
lua/_health.lua): per agent `cf:<agent>` consecutive failures, `lf:` the last failure's time,
`ok:` the last success's, `cs:` consecutive tasks over the latency ceiling, `ls:` the last one's.
Routing reads it for the circuit breaker, ejection and affinity."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class AgentHealth:
    consecutive_failures: int = 0
    last_failure_ms: int = 0
    last_success_ms: int = 0
    consecutive_slow: int = 0
    last_slow_ms: int = 0


_FIELDS = {"cf": "consecutive_failures", "lf": "last_failure_ms", "ok": "last_success_ms",
           "cs": "consecutive_slow", "ls": "last_slow_ms"}


def parse_health(fields: dict[str, str]) -> dict[str, AgentHealth]:
    """Agent id -> health, from the hash's fields (those that do not parse are left out)."""
    out: dict[str, AgentHealth] = {}
    for name, value in fields.items():
        kind, _, agent = name.partition(":")
        if kind in _FIELDS and agent:
            try:
                setattr(out.setdefault(agent, AgentHealth()), _FIELDS[kind], int(value))
            except ValueError:
                continue
    return out
