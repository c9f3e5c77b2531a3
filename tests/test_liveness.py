"""An agent whose process is gone has its tasks handed on at once, not when their leases lapse
(dispatcher/liveness.py); a frozen one keeps them. Real workers, a real dispatcher, real signals.
The leases here, and the time an agent takes to be judged offline by its heartbeats (whose tasks
are handed on then), are a minute long: only the agent's connections can tell it is gone."""

from __future__ import annotations

import signal
import time
from typing import Any

import redis

from broker import ReachClient
from broker.keys import RegistryKeys
from dispatcher.liveness import CHECK_S, gone_ms
from tests.conftest import Fleet, wait_until
from tests.handlers import runs

SLOW = {"lease_ms": 60_000, "offline_after_ms": 60_000}


def _named_connections(r: redis.Redis, prefix: str, agent_id: str) -> int:
    """The agent's connections, on every primary of a Cluster."""
    name = RegistryKeys(prefix).agent_client(agent_id)
    if hasattr(r, "get_primaries"):
        replies: Any = r.client_list(_type="normal", target_nodes=r.PRIMARIES)
        clients = [c for node in replies.values() for c in node] if isinstance(replies, dict) else replies
    else:
        clients = r.client_list(_type="normal")
    return sum(1 for c in clients if c.get("name") == name)


def test_a_killed_agents_running_tasks_go_to_another_at_once(make_settings: Any, fleet: Fleet,
                                                             r: redis.Redis, prefix: str) -> None:
    settings = make_settings(**SLOW)
    with ReachClient(settings) as client:
        fleet.dispatcher(settings=settings)
        first = fleet.worker("gone", handler="tests.handlers:sleepy", settings=settings)
        handles = [client.submit("gone", {"n": f"t{i}", "s": 30, "then_s": 0.1}) for i in range(3)]
        wait_until(lambda: runs(r, prefix) == {"t0": 1, "t1": 1, "t2": 1}, message="all three started")
        assert _named_connections(r, prefix, first.agent_id or "") >= 2  # (its reader and heartbeat)
        second = fleet.worker("gone", handler="tests.handlers:sleepy", settings=settings)
        killed_at = time.monotonic()
        first.kill()
        for handle in handles:
            assert handle.result(timeout=30) == {"slept": 0.1, "attempt": 2}
        # (gone_ms without a connection, a listing, a heartbeat's worth of slack: not the lease)
        assert time.monotonic() - killed_at < gone_ms(settings) / 1000 + 3 * CHECK_S + 5
        for handle in handles:
            status = client.status(handle.task_id)
            assert status.agent_id == second.agent_id and status.attempt == 2
            types = [e.type for e in client.events(handle.task_id, timeout=10)]
            assert types.count("reclaimed") == 1 and types.count("succeeded") == 1
        assert runs(r, prefix) == {"t0": 2, "t1": 2, "t2": 2}


def test_a_frozen_agent_keeps_its_task(make_settings: Any, fleet: Fleet, r: redis.Redis,
                                       prefix: str) -> None:
    # SIGSTOP leaves its connections open: it may come back, and until its lease lapses (or it
    # is offline) the task stays its own.
    settings = make_settings(**SLOW)
    with ReachClient(settings) as client:
        fleet.dispatcher(settings=settings)
        first = fleet.worker("frozen", handler="tests.handlers:sleepy", settings=settings)
        handle = client.submit("frozen", {"n": "f", "s": 1})
        wait_until(lambda: runs(r, prefix) == {"f": 1}, message="the handler started")
        fleet.worker("frozen", handler="tests.handlers:sleepy", settings=settings)
        first.signal(signal.SIGSTOP)
        try:
            deadline = time.monotonic() + gone_ms(settings) / 1000 + 3 * CHECK_S
            while time.monotonic() < deadline:  # (a bounded window: the task may not move in it)
                status = client.status(handle.task_id)
                assert status.attempt == 1 and status.agent_id == first.agent_id
                time.sleep(0.2)
        finally:
            first.signal(signal.SIGCONT)
        assert handle.result(timeout=30) == {"slept": 1, "attempt": 1}
        assert runs(r, prefix) == {"f": 1}
