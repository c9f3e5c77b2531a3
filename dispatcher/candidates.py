"""The agents of a capability as routing sees them: one Candidate per healthy agent, and why
each other agent is out. The one place a registry record, an inbox load, a health entry and a
told speed become a candidate: the dispatcher's rounds and `reach explain` both build theirs
here."""

from __future__ import annotations

import math
from collections.abc import Callable, Container, Iterable

from broker.protocol.health import AgentHealth
from broker.registry import AgentRecord, AgentState
from dispatcher.routing import Candidate, InboxLoad


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def usable_slots(record: AgentRecord) -> int:
    """The agent's slots less those held by handlers that ran past their timeout (Python cannot
    stop them): they run nothing. (When they hold every slot the agent leaves.)"""
    held = _number(record.stats.get("held_slots")) or 0.0
    held = min(max(held, 0.0), record.max_concurrency) if math.isfinite(held) else 0.0
    return record.max_concurrency - int(held)


def candidate(record: AgentRecord, load: InboxLoad, health: AgentHealth,
              recent_exec_ms: float | None) -> Candidate:
    stats = record.stats
    # (The agent is sent work for the slots its handlers do not hold.)
    return Candidate(
        agent_id=record.agent_id,
        max_concurrency=max(1, usable_slots(record)),
        load=load,
        latency_p50_ms=_number(stats.get("latency_p50_ms")),
        latency_baseline_ms=_number(stats.get("latency_baseline_ms")),
        stability=_number(stats.get("stability")),
        region=record.descriptor.region,
        version=record.descriptor.version,
        recovered_at_ms=record.recovered_at_ms,
        health=health,
        recent_exec_ms=recent_exec_ms,
    )


def gather(records: Iterable[AgentRecord], state_of: Callable[[AgentRecord], AgentState],
           load_of: Callable[[str], InboxLoad], health_of: Callable[[str], AgentHealth],
           speed_of: Callable[[str], float | None]) -> tuple[list[Candidate], dict[str, str]]:
    """The healthy agents as candidates, and the others with the state that keeps them out.
    A candidate holds the load and health objects `load_of` and `health_of` return: a round
    counts its choices in that load (a dispatcher passes its own, which then stays current)."""
    out, filtered = [], {}
    for record in records:
        state = state_of(record)
        if state is not AgentState.HEALTHY:
            filtered[record.agent_id] = f"state:{state.value}"
            continue
        agent_id = record.agent_id
        out.append(candidate(record, load_of(agent_id), health_of(agent_id), speed_of(agent_id)))
    return out, filtered


def without(candidates: list[Candidate], filtered: dict[str, str], agents: Container[str],
            reason: str) -> tuple[list[Candidate], dict[str, str]]:
    """The candidates but `agents`, each of those filtered as `reason` (for `reach explain`)."""
    out = dict(filtered)
    kept = []
    for c in candidates:
        if c.agent_id in agents:
            out[c.agent_id] = reason
        else:
            kept.append(c)
    return kept, out
