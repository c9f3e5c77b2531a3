"""The agent health hash of a capability, as complete.lua and reclaim.lua keep it (see
lua/_health.lua): per agent `cf:<agent>` consecutive failures, `lf:` the last failure's time,
`ok:` the last success's, `cs:` consecutive tasks over the latency ceiling, `ls:` the last one's,
and `sp:` its speed: `<ms> <samples> <told ms>`, a moving geometric mean of its successful
tasks' execution times (alpha SPEED_ALPHA, a plain mean of the first 1 / SPEED_ALPHA), how many
it counted (capped), and the speed last told to the dispatchers in a `free` wake-up.
Routing reads it for the circuit breaker, ejection, affinity and speed."""

from __future__ import annotations

from dataclasses import dataclass

SPEED_ALPHA = 0.2
"""Weight of each new task in an agent's speed (lua/_health.lua's SPEED_ALPHA)."""
SPEED_KNOWN = 5
"""Tasks counted before an agent's speed is judged (lua/_health.lua tells it at this count)."""
SPEED_FLOOR_MS = 10.0
"""Execution times below this count as this (lua/_health.lua's SPEED_FLOOR_MS): a 1 ms task
against a 3 ms one is no slowness worth routing around, only noise."""
SPEED_TELL_FACTOR = 1.5
"""A completion tells the dispatchers an agent's speed once it moved this much (either way)
since they were last told (lua/_health.lua's SPEED_TELL)."""


@dataclass(slots=True)
class AgentHealth:
    consecutive_failures: int = 0
    last_failure_ms: int = 0
    last_success_ms: int = 0
    consecutive_slow: int = 0
    last_slow_ms: int = 0
    speed_ms: float = 0.0
    """Typical execution time of its latest successful tasks (0: none counted)."""
    speed_samples: int = 0


_FIELDS = {"cf": "consecutive_failures", "lf": "last_failure_ms", "ok": "last_success_ms",
           "cs": "consecutive_slow", "ls": "last_slow_ms"}


def parse_speed(value: str) -> tuple[float, int] | None:
    """(speed ms, samples) from an `sp:` field, or None when it does not parse."""
    parts = value.split(" ")
    try:
        ms, samples = float(parts[0]), int(parts[1])
    except (ValueError, IndexError):
        return None
    if not ms >= 0 or ms == float("inf") or samples < 0:  # (nan fails the first test)
        return None
    return ms, samples


def parse_health(fields: dict[str, str]) -> dict[str, AgentHealth]:
    """Agent id -> health, from the hash's fields (those that do not parse are left out)."""
    out: dict[str, AgentHealth] = {}
    for name, value in fields.items():
        kind, _, agent = name.partition(":")
        if not agent:
            continue
        if kind == "sp":
            speed = parse_speed(value)
            if speed is not None:
                h = out.setdefault(agent, AgentHealth())
                h.speed_ms, h.speed_samples = speed
        elif kind in _FIELDS:
            try:
                setattr(out.setdefault(agent, AgentHealth()), _FIELDS[kind], int(value))
            except ValueError:
                continue
    return out
