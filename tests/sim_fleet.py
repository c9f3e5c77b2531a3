"""A simulated fleet for scale tests: many agents in one process, speaking Reach's own protocol.

Every agent is registered and bound with the real scripts, heartbeats (batched, numbers written
only when they change, as real workers do), and its tasks are read from its inbox, accepted and
completed through the real accept/complete scripts, so every task really ends `succeeded`.
Only the handler is missing: the result is the payload.

    python -m tests.sim_fleet --agents 1000 --capabilities 50   (REDIS_URL, REACH_* as usual)
"""

from __future__ import annotations

import argparse
import hashlib
import secrets
import signal
import threading
from collections import defaultdict
from typing import Any

from broker import Settings, codec
from broker.infra import connection
from broker.keys import AGENT_GROUP, CapabilityKeys
from broker.models import AgentDescriptor
from broker.protocol.agents import bind_call, heartbeat_call, register_call
from broker.protocol.delivery import Lease, accept_call, parse_accept
from broker.protocol.reports import Completion, complete_call
from broker.scripts import Scripts

CONCURRENCY = 8


def capability_of(index: int, capabilities: int) -> str:
    return f"cap{index % capabilities:03d}"


class SimFleet:
    def __init__(self, settings: Settings, agents: int, capabilities: int) -> None:
        self.settings = settings
        self.redis: Any = connection.sync_client(settings)
        self.scripts = Scripts(self.redis)
        self.agents = [(f"sim-{i:05d}", capability_of(i, capabilities)) for i in range(agents)]
        self.tokens: dict[str, str] = {}
        self.stop = threading.Event()

    def register(self) -> None:
        for agent_id, capability in self.agents:
            token = secrets.token_urlsafe(16)
            sha = hashlib.sha1(token.encode()).hexdigest()
            descriptor = AgentDescriptor(agent_id=agent_id, capabilities=[capability],
                                         max_concurrency=CONCURRENCY)
            self.scripts(register_call(self.settings, agent_id, sha,
                                                descriptor.model_dump_json(), 0, [capability]))
            self.scripts(bind_call(self.settings, capability, agent_id, sha))
            self.tokens[agent_id] = token

    def heartbeat_forever(self) -> None:
        stats = {"inflight": 0, "latency_p50_ms": 1.0, "latency_baseline_ms": 1.0, "health": 1.0,
                 "stability": 1.0, "stalled": False}
        first = True
        while not self.stop.is_set():
            pipe = self.redis.pipeline(transaction=False)
            for agent_id, _ in self.agents:
                call = heartbeat_call(self.settings, agent_id, self.tokens[agent_id], stats,
                                               significant=first)
                self.scripts(call, client=pipe)
            pipe.execute()
            first = False
            self.stop.wait(self.settings.heartbeat_ms / 1000)

    def consume_forever(self) -> None:
        by_capability: dict[str, list[str]] = defaultdict(list)
        for agent_id, capability in self.agents:
            by_capability[capability].append(agent_id)
        streams = {CapabilityKeys(self.settings.prefix, cap).inbox(agent): ">"
                   for cap, agents in by_capability.items() for agent in agents}
        owner = {CapabilityKeys(self.settings.prefix, cap).inbox(agent): (cap, agent)
                 for cap, agents in by_capability.items() for agent in agents}
        while not self.stop.is_set():
            # One blocking read over every inbox (one Redis, so one call may name them all).
            reply = self.redis.xreadgroup(AGENT_GROUP, "sim", streams, count=CONCURRENCY, block=100)
            for stream, entries in reply or []:
                capability, agent_id = owner[stream]
                self._finish(capability, agent_id, entries)

    def _finish(self, capability: str, agent_id: str, entries: list[Any]) -> None:
        token = self.tokens[agent_id]
        deliveries = [Lease(e, f["id"], f["fence"]) for e, f in entries if f]
        if not deliveries:
            return
        accepted = parse_accept(deliveries, self.scripts(accept_call(
            self.settings, capability, agent_id, token, deliveries))).accepted
        done = [Completion(t.entry_id, t.local_id, t.fence, "success", t.payload, 0, 1)
                for t in accepted]
        if done:
            self.scripts(complete_call(self.settings, capability, agent_id, token, done))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--agents", type=int, required=True)
    parser.add_argument("--capabilities", type=int, required=True)
    args = parser.parse_args()
    fleet = SimFleet(Settings.load(), args.agents, args.capabilities)
    fleet.register()
    signal.signal(signal.SIGTERM, lambda *_: fleet.stop.set())
    beats = threading.Thread(target=fleet.heartbeat_forever, daemon=True)
    beats.start()
    print(codec.dumps({"ready": len(fleet.agents)}), flush=True)
    fleet.consume_forever()


if __name__ == "__main__":
    main()
