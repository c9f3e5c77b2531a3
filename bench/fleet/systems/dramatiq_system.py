"""dramatiq: one worker process per agent (4 threads, default prefetch), RedisBroker, Results
with the Redis backend, its Retries middleware (3 attempts, backoff from 500 ms); see
bench/fleet/agents/dramatiq_agent.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from bench.fleet.systems.base import System
from bench.procs import Proc


class DramatiqSystem(System):
    key = "dramatiq"
    title = "dramatiq"

    def unavailable(self) -> str | None:
        if importlib.util.find_spec("dramatiq") is None:
            return "dramatiq is not installed (pip install 'agent-reach[bench]')"
        return None

    def settings(self) -> dict[str, Any]:
        import dramatiq

        return {"version": dramatiq.__version__,
                "agent": f"dramatiq.Worker(RedisBroker, worker_threads={self.ctx.concurrency}), one per "
                         "process; default prefetch (2 x threads); default heartbeat timeout (60 s)",
                "retries": "Retries middleware: max_retries=2 (3 attempts), min_backoff 500 ms, "
                           "max_backoff 8 s, with its jitter",
                "outcome": "the Results backend's result key (what get_result(block=True) pops)"}

    def start_agent(self, name: str, env: dict[str, str]) -> Proc:
        argv = self.ctx.python("bench.fleet.agents.dramatiq_agent", "--url", self.ctx.url,
                               "--threads", str(self.ctx.concurrency))
        return self.ctx.sup.spawn(f"dramatiq-{name}", argv, {**self.ctx.env(), **env}, piped=True)

    def start_producer(self, plan: Path, out: Path, deadline_s: float) -> Proc:
        argv = self.ctx.python("bench.fleet.producers.dramatiq_producer", "--url", self.ctx.url,
                               "--plan", str(plan), "--out", str(out), "--deadline-s", str(deadline_s))
        return self.ctx.sup.spawn("dramatiq-producer", argv, self.ctx.env(), piped=True)
