"""Celery: one worker process per agent (threads pool, concurrency 4, default prefetch, acks
late), the Redis broker and result backend; see bench/fleet/agents/celery_app.py for each
setting and why."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from bench.fleet.systems.base import System
from bench.procs import Proc


class CelerySystem(System):
    key = "celery"
    title = "Celery"

    def unavailable(self) -> str | None:
        if importlib.util.find_spec("celery") is None:
            return "Celery is not installed (pip install 'agent-reach[bench]')"
        return None

    def settings(self) -> dict[str, Any]:
        import celery  # type: ignore[import-untyped]

        from bench.fleet.agents.celery_app import MAX_RETRIES, VISIBILITY_TIMEOUT_S

        return {"version": celery.__version__,
                "agent": f"celery worker --pool threads --concurrency {self.ctx.concurrency}, one per "
                         "process; default prefetch (4 x concurrency); task_acks_late=True",
                "broker": f"Redis; visibility_timeout {VISIBILITY_TIMEOUT_S} s (default 1 h) so that a "
                          "killed worker's unacked tasks are delivered again; unacked sweep every 10 s",
                "retries": f"autoretry_for the agent's error, max_retries={MAX_RETRIES} (3 attempts), "
                           "retry_backoff=1 (Celery's smallest factor: 1 s, 2 s) with full jitter",
                "outcome": "the result backend's pub/sub message (what AsyncResult.get() waits on)"}

    def env(self) -> dict[str, str]:
        return self.ctx.env(FLEET_REDIS_URL=self.ctx.url)

    def start_agent(self, name: str, env: dict[str, str]) -> Proc:
        argv = self.ctx.python("bench.fleet.agents.celery_worker", "--name", name,
                               "--concurrency", str(self.ctx.concurrency))
        return self.ctx.sup.spawn(f"celery-{name}", argv, {**self.env(), **env}, piped=True)

    def start_producer(self, plan: Path, out: Path, deadline_s: float) -> Proc:
        argv = self.ctx.python("bench.fleet.producers.celery_producer", "--url", self.ctx.url,
                               "--plan", str(plan), "--out", str(out), "--deadline-s", str(deadline_s))
        return self.ctx.sup.spawn("celery-producer", argv, self.env(), piped=True)
