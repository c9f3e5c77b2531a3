"""Reading what Redis says about agents and their tasks, for the registry and lifecycle tests."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import redis

from broker import TaskHandle
from broker.client.events import read_events
from broker.ids import split_task_id
from broker.keys import AGENT_GROUP, CapabilityKeys, RegistryKeys
from broker.registry import server_ms
from broker.settings import Settings
from tests.conftest import ROOT, Proc, settings_env, wait_until

MakeSettings = Callable[..., Settings]


def now_ms(r: redis.Redis) -> int:
    return server_ms(r.time())


def registry_events(r: redis.Redis, prefix: str, agent_id: str | None = None) -> list[dict[str, str]]:
    events = [fields for _, fields in r.xrange(RegistryKeys(prefix).events)]
    return [e for e in events if agent_id is None or e.get("agent_id") == agent_id]


def wait_pruned(r: redis.Redis, prefix: str, agent_id: str, timeout: float) -> None:
    """Until a dispatcher recorded that it pruned the agent (its record, token and inbox go next)."""
    wait_until(lambda: any(e["type"] == "pruned" for e in registry_events(r, prefix, agent_id)),
               timeout=timeout, message=f"agent {agent_id} pruned")


def state_changes(r: redis.Redis, prefix: str, agent_id: str) -> list[str]:
    """The transitions the dispatcher(s) recorded for an agent, as "old -> new"."""
    return [e["detail"] for e in registry_events(r, prefix, agent_id) if e["type"] == "state"]


def agent_hash(r: redis.Redis, prefix: str, agent_id: str) -> dict[str, str]:
    return r.hgetall(RegistryKeys(prefix).agent(agent_id))


def agent_stats(r: redis.Redis, prefix: str, agent_id: str) -> dict[str, Any]:
    return json.loads(agent_hash(r, prefix, agent_id).get("stats") or "{}")


def recorded_state(r: redis.Redis, prefix: str, agent_id: str) -> str | None:
    return r.hget(RegistryKeys(prefix).agent(agent_id), "state")


def task_events(r: redis.Redis, prefix: str, task_id: str) -> list[dict[str, Any]]:
    capability, local = split_task_id(task_id)
    key = CapabilityKeys(prefix, capability).task(local)
    return [e.as_dict() for e in read_events(r, key, task_id)]


def task_record(r: redis.Redis, prefix: str, task_id: str) -> dict[str, str]:
    capability, local = split_task_id(task_id)
    return r.hgetall(CapabilityKeys(prefix, capability).task(local))


def first_event(events: list[dict[str, Any]], etype: str) -> dict[str, Any]:
    found = [e for e in events if e["type"] == etype]
    assert found, f"no {etype!r} event in {[e['type'] for e in events]}"
    return found[0]


def inbox_load(r: redis.Redis, prefix: str, capability: str, agent_id: str) -> tuple[int, int]:
    """(entries in the agent's inbox, of which the agent has read)."""
    inbox = CapabilityKeys(prefix, capability).inbox(agent_id)
    length = r.xlen(inbox)
    try:
        pending = int(r.xpending(inbox, AGENT_GROUP)["pending"])
    except redis.exceptions.ResponseError:  # no group yet
        pending = 0
    return length, pending


def inbox_entries(r: redis.Redis, prefix: str, capability: str, agent_id: str) -> dict[str, tuple[str, str]]:
    """local task id -> (inbox entry id, fencing token) of each entry in the agent's inbox."""
    inbox = CapabilityKeys(prefix, capability).inbox(agent_id)
    return {fields["id"]: (entry_id, fields["fence"]) for entry_id, fields in r.xrange(inbox)}


def reach_json(settings: Settings, *args: str) -> Any:
    done = subprocess.run([sys.executable, "-m", "reach_cli", *args, "--json"],
                          env=settings_env(settings), cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def alive(proc: Proc) -> None:
    assert proc.popen.poll() is None, f"{proc.name} exited:\n{proc.output()[-3000:]}"


def holds_one_running_one_unread(r: redis.Redis, prefix: str, capability: str, proc: Proc,
                                 running: TaskHandle) -> bool:
    """The agent read one entry and accepted its task (`running`); one more waits unread."""
    alive(proc)
    assert proc.agent_id
    return (inbox_load(r, prefix, capability, proc.agent_id) == (2, 1)
            and running.status().state == "running")
