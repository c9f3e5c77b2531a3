"""What operators look at: every agent with its state and load, every capability's queues
(and its agents and description: broker/ops/catalog.py).

Read-only, with a synchronous client; `reach agents`, `reach queues` and the console use it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from broker.infra.connection import SyncRedis
from broker.keys import AGENT_GROUP, CapabilityKeys, RegistryKeys
from broker.registry import AgentRecord, agent_state, clock_of
from broker.settings import Settings


@dataclass
class AgentRow:
    agent_id: str
    state: str
    capabilities: list[str]
    region: str | None
    version: str | None
    inflight: int
    max_concurrency: int
    last_heartbeat_age_s: float
    backlog: int
    success_rate: float | None
    latency_p50_ms: float | None
    refused_tokens: int
    registrations_refused: int = 0
    """Registrations of this id refused (it was live and held by another process, a revoked
    token, a missing or wrong join secret)."""
    last_refusal: str | None = None
    last_refusal_age_s: float | None = None
    revoked: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class QueueRow:
    capability: str
    queued: int
    delayed: int
    unread_in_inboxes: int
    running: int
    dead_letters: int
    oldest_queued_age_s: float | None
    agents: int
    healthy_agents: int
    max_queue_depth: int
    paused: bool = False
    paused_reason: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _records(client: SyncRedis, settings: Settings) -> tuple[int, list[AgentRecord]]:
    rk = RegistryKeys(settings.prefix)
    now = clock_of(client, rk.agents)
    ids: Any = client.zrange(rk.agents, 0, -1)
    pipe = client.pipeline(transaction=False)
    for agent_id in ids:
        pipe.hgetall(rk.agent(agent_id))
    records = [AgentRecord.from_hash(d) for d in (pipe.execute() if ids else []) if d]
    return now, [r for r in records if r is not None]


Pair = tuple[str, str]


def _inbox_loads(client: SyncRedis, settings: Settings,
                 pairs: list[Pair]) -> dict[Pair, tuple[int, int, int]]:
    """(capability, agent) -> (entries in its inbox, of which read and running, refused tokens)."""
    if not pairs:
        return {}
    pipe = client.pipeline(transaction=False)
    for capability, agent_id in pairs:
        ck = CapabilityKeys(settings.prefix, capability)
        pipe.xlen(ck.inbox(agent_id))
        pipe.xpending(ck.inbox(agent_id), AGENT_GROUP)
        pipe.hget(ck.tokens, f"refused:{agent_id}")
    replies = pipe.execute(raise_on_error=False)
    out = {}
    for i, pair in enumerate(pairs):
        length, pending, refused = replies[3 * i : 3 * i + 3]
        running = pending.get("pending", 0) if isinstance(pending, dict) else 0
        out[pair] = (int(length) if isinstance(length, int) else 0, int(running),
                     int(refused) if isinstance(refused, str) and refused.isdigit() else 0)
    return out


def load_fleet(client: SyncRedis, settings: Settings, capability: str | None = None
               ) -> tuple[int, list[AgentRecord], dict[Pair, tuple[int, int, int]]]:
    """(server ms now, agents (serving `capability`, if given), their inbox loads)."""
    now, records = _records(client, settings)
    if capability:
        records = [r for r in records if capability in r.capabilities]
    pairs = [(c, r.agent_id) for r in records for c in r.capabilities]
    return now, records, _inbox_loads(client, settings, pairs)


def agent_rows(client: SyncRedis, settings: Settings, capability: str | None = None) -> list[AgentRow]:
    now, records, loads = load_fleet(client, settings, capability)
    rows = []
    for r in sorted(records, key=lambda x: x.agent_id):
        mine = [loads.get((c, r.agent_id), (0, 0, 0)) for c in r.capabilities]
        outstanding = sum(m[0] for m in mine)
        running = sum(m[1] for m in mine)
        done, failed = r.stats.get("done") or 0, r.stats.get("failed") or 0
        p50 = r.stats.get("latency_p50_ms")
        refused = r.refused + sum(m[2] for m in mine)
        rows.append(AgentRow(
            agent_id=r.agent_id,
            state=agent_state(r, now, settings).value,
            capabilities=r.capabilities,
            region=r.descriptor.region,
            version=r.descriptor.version,
            inflight=running,
            max_concurrency=r.max_concurrency,
            last_heartbeat_age_s=round(r.heartbeat_age_ms(now) / 1000, 1),
            backlog=max(0, outstanding - running),
            success_rate=round((done - failed) / done, 4) if done else None,
            latency_p50_ms=float(p50) if isinstance(p50, int | float) else None,
            refused_tokens=refused,
            registrations_refused=r.registrations_refused,
            last_refusal=r.last_refusal or None,
            last_refusal_age_s=(round(max(0, now - r.last_refused_at_ms) / 1000, 1)
                                if r.last_refused_at_ms else None),
            revoked=bool(r.revoked_at_ms),
        ))
    return rows


def capabilities(client: SyncRedis, settings: Settings) -> list[str]:
    return sorted(str(name) for name in client.smembers(RegistryKeys(settings.prefix).capabilities))


def queue_rows(client: SyncRedis, settings: Settings, capability: str | None = None) -> list[QueueRow]:
    now, records = _records(client, settings)
    names = [capability] if capability else capabilities(client, settings)
    rows = []
    for name in names:
        ck = CapabilityKeys(settings.prefix, name)
        pipe = client.pipeline(transaction=False)
        pipe.zcard(ck.queue)
        pipe.xlen(ck.intake)
        pipe.zcard(ck.delayed)
        pipe.xlen(ck.dlq)
        pipe.zrange(ck.queue, 0, 0)
        pipe.smembers(ck.inboxes)
        pipe.hmget(ck.policy, "paused", "paused_reason", "max_queue_depth")
        queued, intake, delayed, dlq, head, inbox_agents, policy = pipe.execute()
        oldest = None
        if head:
            queued_at = client.hget(ck.task(head[0]), "queued_at")
            if queued_at:
                oldest = round(max(0, now - int(queued_at)) / 1000, 1)
        loads = _inbox_loads(client, settings, [(name, a) for a in sorted(inbox_agents)])
        serving = [r for r in records if name in r.capabilities]
        healthy = [r for r in serving if agent_state(r, now, settings).value == "healthy"]
        rows.append(QueueRow(
            capability=name,
            queued=int(queued) + int(intake),
            delayed=int(delayed),
            unread_in_inboxes=sum(max(0, n - p) for n, p, _ in loads.values()),
            running=sum(p for _, p, _ in loads.values()),
            dead_letters=int(dlq),
            oldest_queued_age_s=oldest,
            agents=len(serving),
            healthy_agents=len(healthy),
            max_queue_depth=int(policy[2]) if policy[2] else settings.max_queue_depth,
            paused=policy[0] == "1",
            paused_reason=(policy[1] or None) if policy[0] == "1" else None,
        ))
    return rows
