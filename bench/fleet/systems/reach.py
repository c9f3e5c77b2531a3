"""Reach: `reach-worker` agents with the fleet handler, one dispatcher, the async producer.

Agents: `python -m reach_cli.worker --capability fleet --handler
bench.fleet.agents.reach_handler:handle --concurrency 4 --agent-id aN`; one dispatcher,
`python -m reach_cli dispatcher`; only REDIS_URL and REACH_PREFIX set (a labelled variant may
add REACH_* settings). Ready when every agent is registered and healthy by the server clock,
and the dispatcher has routed (its grants stand).
A fenced late result leaves a `late_result_rejected` event on the task's record: those are the
refused duplicates.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench.fleet.systems.base import System
from bench.procs import Proc, ProcessFailed
from bench.rows.reach import wait_healthy
from broker.keys import CapabilityKeys
from broker.scripts import SCRIPT_NAMES, source
from broker.settings import Settings

CAPABILITY = "fleet"
HANDLER = "bench.fleet.agents.reach_handler:handle"


class ReachSystem(System):
    key = "reach"
    title = "Reach"
    stop_command = None

    def settings(self) -> dict[str, Any]:
        return {"agent": f"reach-worker --capability {CAPABILITY} --handler {HANDLER} "
                         f"--concurrency {self.ctx.concurrency}",
                "dispatcher": "python -m reach_cli dispatcher (one process)",
                "settings": self.ctx.reach_env or "defaults (REDIS_URL and REACH_PREFIX only)",
                "retries": "Reach's defaults: 3 attempts, backoff 0.5 s x 2^n (cap 8 s) + U(0, 0.5 s)",
                "outcome": "AsyncReachClient.submit, then handle.result()"}

    def env(self) -> dict[str, str]:
        return self.ctx.env(REDIS_URL=self.ctx.url, REACH_PREFIX=self.ctx.prefix, **self.ctx.reach_env)

    def prepare(self) -> None:
        import redis

        r = redis.Redis.from_url(self.ctx.url)
        for name in SCRIPT_NAMES:
            r.script_load(source(name))
        r.close()

    def start_agent(self, name: str, env: dict[str, str]) -> Proc:
        argv = self.ctx.python("reach_cli.worker", "--capability", CAPABILITY, "--handler", HANDLER,
                               "--agent-id", name, "--concurrency", str(self.ctx.concurrency))
        return self.ctx.sup.spawn(f"reach-{name}", argv, {**self.env(), **env})

    def wait_ready(self, agents: dict[str, Proc]) -> None:
        import redis

        settings = Settings.load(redis_url=self.ctx.url, prefix=self.ctx.prefix)
        r = redis.Redis.from_url(self.ctx.url, decode_responses=True)
        try:
            wait_healthy(r, settings, list(agents), list(agents.values()))
        finally:
            r.close()

    def start_helpers(self) -> list[Proc]:
        """The dispatcher, once it routes: its first round leaves grants for the idle agents.
        (A dispatcher runs for long in production; on a loaded machine its start took a second,
        which the first tasks of a run waited for, counted against Reach.)"""
        import redis

        argv = self.ctx.python("reach_cli", "dispatcher")
        dispatcher = self.ctx.sup.spawn("reach-dispatcher", argv, self.env())
        r = redis.Redis.from_url(self.ctx.url)
        granted = CapabilityKeys(self.ctx.prefix, CAPABILITY).granted
        deadline = time.monotonic() + 60
        try:
            while not r.exists(granted):
                dispatcher.check_alive()
                if time.monotonic() > deadline:
                    raise ProcessFailed(f"reach-dispatcher left no grants within 60 s "
                                        f"(log: {dispatcher.log_path})")
                time.sleep(0.02)
        finally:
            r.close()
        return [dispatcher]

    def start_producer(self, plan: Path, out: Path, deadline_s: float) -> Proc:
        argv = self.ctx.python("bench.fleet.producers.reach_producer", "--url", self.ctx.url,
                               "--prefix", self.ctx.prefix, "--plan", str(plan), "--out", str(out),
                               "--deadline-s", str(deadline_s))
        return self.ctx.sup.spawn("reach-producer", argv, self.env(), piped=True)

    def refused(self, tasks: dict[int, str]) -> dict[int, int]:
        import redis

        r: Any = redis.Redis.from_url(self.ctx.url, decode_responses=True)
        keys = CapabilityKeys(self.ctx.prefix, CAPABILITY)
        out: dict[int, int] = {}
        for i, task_id in tasks.items():
            record = r.hgetall(keys.task(task_id.split(":", 1)[1]))
            out[i] = sum(1 for k, v in record.items()
                         if k.startswith("e:") and v.startswith("late_result_rejected|"))
        r.close()
        return out
