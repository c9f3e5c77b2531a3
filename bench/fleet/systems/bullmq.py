"""BullMQ: one `node fleet_worker.js` process per agent (a Worker, concurrency 4, default lock
and stalled-job settings), the producer `node fleet_producer.js` (3 attempts, exponential
backoff from 500 ms; outcomes from QueueEvents). Both live in bench/bullmq/ beside the main
benchmark's scripts and share its npm install."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from bench.fleet.systems.base import System
from bench.procs import Proc
from bench.rows import bullmq as bullmq_row

QUEUE = "fleet"
REFUSED = re.compile(r"^R (\d+) ")


class BullMQSystem(System):
    key = "bullmq"
    title = "BullMQ"

    def unavailable(self) -> str | None:
        return bullmq_row.unavailable()

    def install(self) -> None:
        bullmq_row.install(self.ctx.log)

    def settings(self) -> dict[str, Any]:
        version, node = bullmq_row.versions()
        return {"version": version, "node": node,
                "agent": f"node fleet_worker.js: one Worker per process, concurrency {self.ctx.concurrency}, "
                         "default lockDuration (30 s) and stalledInterval (30 s)",
                "retries": "attempts: 3, backoff {type: 'exponential', delay: 500} (no jitter)",
                "outcome": "QueueEvents 'completed' and 'failed' in the producer"}

    def _node(self, script: str, *args: str) -> list[str]:
        return ["node", str(bullmq_row.HERE / script), "--url", self.ctx.url, "--prefix", self.ctx.prefix,
                "--queue", QUEUE, *args]

    def start_agent(self, name: str, env: dict[str, str]) -> Proc:
        return self.ctx.sup.spawn(f"bullmq-{name}", self._node(
            "fleet_worker.js", "--concurrency", str(self.ctx.concurrency)),
            {**self.ctx.env(), **env}, piped=True, cwd=bullmq_row.HERE)

    def start_producer(self, plan: Path, out: Path, deadline_s: float) -> Proc:
        return self.ctx.sup.spawn("bullmq-producer", self._node(
            "fleet_producer.js", "--plan", str(plan), "--out", str(out), "--deadline-s", str(deadline_s)),
            self.ctx.env(), piped=True, cwd=bullmq_row.HERE)

    def refused(self, tasks: dict[int, str]) -> dict[int, int]:
        out: dict[int, int] = {}
        for path in self.ctx.run_dir.glob("exec-*.log"):
            for line in path.read_text().splitlines():
                match = REFUSED.match(line)
                if match and int(match[1]) in tasks:
                    out[int(match[1])] = out.get(int(match[1]), 0) + 1
        return out
