"""The fleet's capabilities as the agent protocols offer them: every capability an agent serves
or a producer named, with its agents and its description (what the agents registered).

`reach capabilities`, GET /v1/capabilities, the gateway's A2A skills and its MCP tools read
this. A capability is live while an agent serving it is healthy, warming, not_ready or
suspect (not offline, not draining); its description is the one registered by the newest of
those agents that gave one (agents of a new version bring their new description along).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from broker.infra.connection import SyncRedis
from broker.keys import RegistryKeys
from broker.models import CapabilityDescription, parse_described
from broker.registry import AgentRecord, AgentState, agent_state, clock_of
from broker.settings import Settings

LIVE_STATES = frozenset({AgentState.HEALTHY, AgentState.WARMING, AgentState.NOT_READY, AgentState.SUSPECT})


@dataclass
class CapabilityRow:
    capability: str
    agents: int
    healthy_agents: int
    live_agents: int = 0
    """Agents serving it that are not offline or draining."""
    description: CapabilityDescription = field(default_factory=CapabilityDescription)

    @property
    def live(self) -> bool:
        return self.live_agents > 0

    def as_dict(self) -> dict[str, Any]:
        """The row as `reach capabilities --json` prints it."""
        d = self.description
        return {"capability": self.capability, "agents": self.agents, "healthy_agents": self.healthy_agents,
                "live_agents": self.live_agents, "description": d.description,
                "input_schema": d.input_schema, "output_schema": d.output_schema, "examples": d.examples}


@dataclass
class _Agent:
    record: AgentRecord
    state: AgentState
    described: dict[str, CapabilityDescription]


def _agents(client: SyncRedis, settings: Settings) -> list[_Agent]:
    rk = RegistryKeys(settings.prefix)
    now = clock_of(client, rk.agents)
    ids: Any = client.zrange(rk.agents, 0, -1)
    pipe = client.pipeline(transaction=False)
    for agent_id in ids:
        pipe.hgetall(rk.agent(agent_id))
    out = []
    for data in pipe.execute() if ids else []:
        record = AgentRecord.from_hash(data) if data else None
        if record is not None:
            state = agent_state(record, now, settings)
            out.append(_Agent(record, state, parse_described(data.get("described"))))
    return out


def capability_rows(client: SyncRedis, settings: Settings, live_only: bool = False) -> list[CapabilityRow]:
    """Every capability a producer or an agent named (only those live, with `live_only`)."""
    agents = _agents(client, settings)
    named: Any = client.smembers(RegistryKeys(settings.prefix).capabilities)
    names = {str(n) for n in named} | {c for a in agents for c in a.record.capabilities}
    rows = []
    for name in sorted(names):
        serving = [a for a in agents if name in a.record.capabilities]
        live = [a for a in serving if a.state in LIVE_STATES]
        if live_only and not live:
            continue
        rows.append(CapabilityRow(
            capability=name, agents=len(serving),
            healthy_agents=sum(1 for a in serving if a.state is AgentState.HEALTHY),
            live_agents=len(live), description=_description(name, live or serving)))
    return rows


def _description(name: str, agents: list[_Agent]) -> CapabilityDescription:
    newest_first = sorted(agents, key=lambda a: a.record.registered_at_ms, reverse=True)
    return next((a.described[name] for a in newest_first if name in a.described), CapabilityDescription())
