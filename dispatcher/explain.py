"""Why a task went where it went (or why it is still waiting): `reach explain TASK_ID`.

A dispatched task's record keeps its last routing decision (agent, reason, score, how many
agents were eligible) and points to a snapshot of the routing round (kept 15 minutes): the
candidates with their score parts and every filtered agent with the filter that removed it.
For a task that is still queued, the same routing code is run now, read-only, to say what
would happen.
"""

from __future__ import annotations

import random
from typing import Any

from broker import codec
from broker.errors import UnknownTask
from broker.ids import split_task_id
from broker.keys import CapabilityKeys
from broker.models import TaskStatus
from broker.overview import load_fleet
from broker.registry import agent_state
from broker.settings import Settings
from dispatcher import routing


def _json(text: str | None) -> Any:
    if not text:
        return None
    try:
        return codec.loads(text)
    except ValueError:
        return None


def live_round(client: Any, settings: Settings, capability: str) -> routing.RoutingRound:
    """The routing round a dispatcher would run for this capability right now."""
    ck = CapabilityKeys(settings.prefix, capability)
    now, records, loads = load_fleet(client, settings, capability)
    health = routing.parse_health(client.hgetall(ck.health))
    candidates, filtered = [], {}
    for record in records:
        state = agent_state(record, now, settings)
        if state.value != "healthy":
            filtered[record.agent_id] = f"state:{state.value}"
            continue
        outstanding, running, _ = loads.get((capability, record.agent_id), (0, 0, 0))
        stats = record.stats

        def num(key: str, stats: dict[str, Any] = stats) -> float | None:
            value = stats.get(key)
            return float(value) if isinstance(value, int | float) else None

        candidates.append(routing.Candidate(
            record.agent_id, record.max_concurrency, routing.InboxLoad(outstanding, running),
            num("latency_p50_ms"), num("latency_baseline_ms"), num("stability"),
            record.descriptor.region, record.descriptor.version, record.recovered_at_ms,
            health.get(record.agent_id, routing.AgentHealth()),
        ))
    return routing.RoutingRound(candidates, settings, now, random.Random(0), {}, filtered)


def explain(client: Any, settings: Settings, task_id: str) -> dict[str, Any]:
    capability, local = split_task_id(task_id)
    ck = CapabilityKeys(settings.prefix, capability)
    record = client.hgetall(ck.task(local))
    if not record:
        raise UnknownTask(task_id)
    status = TaskStatus.from_record(record)
    options = _json(record.get("routing")) or {}
    task = routing.ReadyTask(
        local, status.priority, status.session_id or "", status.region or "",
        bool(options.get("region_strict", True)), str(options.get("version") or ""),
        record.get("last_agent_id") or "",
        (client.hget(ck.sessions, status.session_id) or "") if status.session_id else "",
    )
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
    decision = routing.parse_explanation(record.get("explain"))
    if decision is not None:
        decision["at"] = int(record["dispatched_at"]) if record.get("dispatched_at") else None
        decision["agent_id"] = record.get("agent_id") or None
        out["decision"] = decision
        if decision.get("round"):
            out["round"] = _json(client.get(ck.explain(str(decision["round"]))))
    if status.state.value in ("queued", "retrying"):
        round_ = live_round(client, settings, capability)
        choice = round_.choose(task)
        out["now"] = {
            "would_go_to": choice.agent_id if choice else None,
            "why": choice.why if choice else "no agent can take it now",
            "round": round_.snapshot(),
        }
    return out
