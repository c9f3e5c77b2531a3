"""The agent registry as readers see it: records, and the state each one is in right now.

States are judged from the Redis server clock (the `last_seen` the heartbeat script wrote with
TIME, against the server's TIME when read), so a skewed agent or dispatcher clock changes
nothing. Precedence, first match wins:

    offline   no heartbeat for offline_after_ms, or its token was revoked
    suspect   no heartbeat for suspect_after_ms
    draining  the agent said it is shutting down
    warming   inside its declared warmup
    not_ready alive, but its executor made no progress for stall_after_ms while holding tasks
    healthy
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from redis.cluster import RedisCluster

from broker import codec
from broker.models import AgentDescriptor
from broker.settings import Settings


class AgentState(StrEnum):
    WARMING = "warming"
    HEALTHY = "healthy"
    SUSPECT = "suspect"
    OFFLINE = "offline"
    DRAINING = "draining"
    NOT_READY = "not_ready"


@dataclass
class AgentRecord:
    agent_id: str
    descriptor: AgentDescriptor
    last_seen_ms: int
    registered_at_ms: int
    warm_until_ms: int
    mode: str = "active"
    stats: dict[str, Any] = field(default_factory=dict)
    refused: int = 0
    recovered_at_ms: int = 0
    """When it last came back to healthy from suspect, offline or not_ready (cold start)."""
    recorded_state: str = ""
    """The state last written to the registry (by agent_state.lua), to notice transitions."""
    revoked_at_ms: int = 0
    """When an operator revoked its token (0: never); a revoked agent is offline."""
    registrations_refused: int = 0
    """Registrations of its id the registry refused (id live, token revoked, join secret)."""
    last_refused_at_ms: int = 0
    last_refusal: str = ""
    """Why the last one was refused, and who asked (host and pid)."""

    @classmethod
    def from_hash(cls, data: dict[str, str]) -> AgentRecord | None:
        """Parse a registry hash; None when it is not a usable record."""
        try:
            descriptor = AgentDescriptor.model_validate_json(data["descriptor"])
            stats = _clean_stats(codec.loads(data.get("stats") or "{}"))
            return cls(
                agent_id=data["agent_id"],
                descriptor=descriptor,
                last_seen_ms=int(data.get("last_seen") or 0),
                registered_at_ms=int(data.get("registered_at") or 0),
                warm_until_ms=int(data.get("warm_until") or 0),
                mode=data.get("mode") or "active",
                stats=stats,
                refused=int(data.get("refused") or 0),
                recovered_at_ms=int(data.get("recovered_at") or 0),
                recorded_state=data.get("state") or "",
                revoked_at_ms=int(data.get("revoked_at") or 0),
                registrations_refused=int(data.get("register_refused") or 0),
                last_refused_at_ms=int(data.get("last_refused_at") or 0),
                last_refusal=data.get("last_refused") or "",
            )
        except (KeyError, ValueError, TypeError, RecursionError):
            return None  # (RecursionError: a stats text nested too deeply to parse)

    @property
    def capabilities(self) -> list[str]:
        return self.descriptor.capabilities

    @property
    def max_concurrency(self) -> int:
        return self.descriptor.max_concurrency

    def heartbeat_age_ms(self, now_ms: int) -> int:
        return max(0, now_ms - self.last_seen_ms)


# The heartbeat stats that readers take as numbers, and those they take as flags.
_NUMERIC_STATS = frozenset({"inflight", "max_concurrency", "free_slots", "held_slots", "loop_progress_age_ms",
                            "loop_lag_ms", "latency_p50_ms", "latency_baseline_ms", "health",
                            "stability", "done", "failed",
                            "rejected", "rss_kb"})
_FLAG_STATS = frozenset({"draining", "stalled"})


def _clean_stats(stats: Any) -> dict[str, Any]:
    """A record's heartbeat stats with every value of the wrong kind left out (a stranger's or
    a broken agent's record must not break routing, health or `reach agents`)."""
    if not isinstance(stats, dict):
        return {}
    clean: dict[str, Any] = {}
    for key, value in stats.items():
        if key in _NUMERIC_STATS:
            if isinstance(value, int | float) and not isinstance(value, bool):
                clean[key] = value
        elif key in _FLAG_STATS:
            if isinstance(value, bool):
                clean[key] = value
        else:
            clean[key] = value
    return clean


def agent_state(record: AgentRecord, now_ms: int, settings: Settings) -> AgentState:
    age = record.heartbeat_age_ms(now_ms)
    if age >= settings.offline_after_ms or record.revoked_at_ms:
        return AgentState.OFFLINE
    if age >= settings.suspect_after_ms:
        return AgentState.SUSPECT
    if record.mode == "draining" or record.stats.get("draining"):
        return AgentState.DRAINING
    if now_ms < record.warm_until_ms:
        return AgentState.WARMING
    if is_stalled(record.stats, settings):
        return AgentState.NOT_READY
    return AgentState.HEALTHY


def is_stalled(stats: dict[str, Any], settings: Settings) -> bool:
    """The executor loop made no progress for stall_after_ms while the agent holds tasks."""
    if isinstance(stats.get("stalled"), bool):
        return bool(stats["stalled"])  # judged by the agent, against the same stall_after_ms
    progress_age = stats.get("loop_progress_age_ms")
    inflight = stats.get("inflight") or 0
    return (isinstance(progress_age, int | float) and progress_age >= settings.stall_after_ms
            and inflight > 0)


def server_ms(time_reply: tuple[int, int] | list[int]) -> int:
    """Milliseconds from a TIME reply."""
    seconds, micros = time_reply
    return int(seconds) * 1000 + int(micros) // 1000


SERVER_TIME_LUA = "return redis.call('TIME')"


def clock_of(client: Any, key: str) -> int:
    """The server time (ms) of the node that holds `key`: on Cluster each node has its own
    clock, and a time is compared with times that node wrote. (A single node's is a plain
    TIME, which a user with read-only keys may send: EVAL counts its keys as written.)"""
    if not isinstance(client, RedisCluster):
        return server_ms(client.time())
    return server_ms(client.eval(SERVER_TIME_LUA, 1, key))
