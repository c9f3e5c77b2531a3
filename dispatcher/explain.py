"""Why a task went where it went (or why it is still waiting): `reach explain TASK_ID`.

A dispatched task's record keeps its last routing decision (agent, reason, score, how many
agents were eligible) and points to a snapshot of the routing round (kept 15 minutes): the
candidates with their score parts and every filtered agent with the filter that removed it.
For a task that is still queued, the round a dispatcher would run now is built from the same
candidates (dispatcher/candidates.py) and run read-only, to say what would happen.
"""

from __future__ import annotations

import random
from typing import Any

from broker import codec
from broker.errors import UnknownTask
from broker.ids import split_task_id
from broker.infra.connection import SyncRedis
from broker.keys import CapabilityKeys
from broker.models import TaskStatus
from broker.ops.overview import load_fleet
from broker.protocol import queue_score
from broker.protocol.grants import Explanation
from broker.protocol.health import AgentHealth, parse_health
from broker.registry import AgentRecord, agent_state
from broker.settings import Settings
from dispatcher import candidates
from dispatcher.ready import routing_options
from dispatcher.routing import InboxLoad, ReadyTask, RoutingRound


def _json(text: str | None) -> Any:
    if not text:
        return None
    try:
        return codec.loads(text)
    except ValueError:
        return None


def live_round(client: SyncRedis, settings: Settings, capability: str) -> RoutingRound:
    """The routing round a dispatcher would run for this capability right now (with the loads
    and health in Redis; a dispatcher's told speeds and probes are its own, not in Redis)."""
    ck = CapabilityKeys(settings.prefix, capability)
    now, records, loads = load_fleet(client, settings, capability)
    fields: Any = client.hgetall(ck.health)
    health = parse_health(fields)

    def state_of(record: AgentRecord) -> Any:
        return agent_state(record, now, settings)

    def load_of(agent_id: str) -> InboxLoad:
        outstanding, running, _ = loads.get((capability, agent_id), (0, 0, 0))
        return InboxLoad(outstanding, running)

    found, filtered = candidates.gather(records, state_of, load_of,
                                        lambda agent_id: health.get(agent_id) or AgentHealth(),
                                        lambda agent_id: None)
    return RoutingRound(found, settings, now, random.Random(0), {}, filtered)


def _task(client: SyncRedis, ck: CapabilityKeys, local: str, record: dict[str, str],
          status: TaskStatus, aging_ms: int) -> ReadyTask:
    options = routing_options(record.get("routing"))
    session_agent: Any = (client.hget(ck.sessions, status.session_id) or "") if status.session_id else ""
    score: Any = client.zscore(ck.queue, local)
    ready_at = queue_score.ready_at(float(score), status.priority, aging_ms) if score is not None else 0
    return ReadyTask(
        local, status.priority, status.session_id or "", status.region or "",
        bool(options.get("region_strict", True)), str(options.get("version") or ""),
        record.get("last_agent_id") or "", session_agent, ready_at,
    )


def explain(client: SyncRedis, settings: Settings, task_id: str) -> dict[str, Any]:
    capability, local = split_task_id(task_id)
    ck = CapabilityKeys(settings.prefix, capability)
    record: Any = client.hgetall(ck.task(local))
    if not record:
        raise UnknownTask(task_id)
    status = TaskStatus.from_record(record)
    task = _task(client, ck, local, record, status, settings.aging_ms)
    out: dict[str, Any] = {
        "task": status.cli_dict(),
        "constraints": {"region": task.region or None, "region_strict": task.region_strict,
                        "version": task.version or None, "session_id": task.session_id or None,
                        "session_agent": task.session_agent or None,
                        "avoid_agent": task.last_agent_id or None},
        "decision": None,
        "round": None,
        "now": None,
    }
    decision = Explanation.parse(record.get("explain"))
    if decision is not None:
        out["decision"] = {**decision.as_dict(),
                           "at": int(record["dispatched_at"]) if record.get("dispatched_at") else None,
                           "agent_id": record.get("agent_id") or None}
        if decision.round_id:
            snapshot: Any = client.get(ck.explain(decision.round_id))
            out["round"] = _json(snapshot)
    if status.state.value in ("queued", "retrying"):
        round_ = live_round(client, settings, capability)
        choice = round_.choose(task)
        out["now"] = {
            "would_go_to": choice.agent_id if choice else None,
            "why": choice.why if choice else "no agent can take it now",
            "round": round_.snapshot(),
        }
    return out
