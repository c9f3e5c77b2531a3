"""BullMQ (Node.js), the strongest Redis queue we know: workers with concurrency 8.

bench/bullmq/ holds the Node scripts and a package.json pinning BullMQ and ioredis; the first
run installs them with npm (node_modules is never committed). Without Node.js or npm the row is
skipped with a note. Producer: a `node producer.js` process per measurement, which times only its
own adds (`queue.add` one at a time, `queue.addBulk` for the bulk figure) after connecting; round
trips are `add` + `job.waitUntilFinished(queueEvents)`. Workers: `node worker.js`, one BullMQ
`Worker` per process with concurrency 8 and default options (completed jobs are kept, like
Reach's results). Drain times are the `completed` set's scores, i.e. each job's `finishedOn`,
written by the worker together with the return value.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.procs import ProcessFailed, stop_all
from bench.rows.base import Drain, Row, Workers, go_all, ready_all

HERE = Path(__file__).resolve().parent.parent / "bullmq"
QUEUE = "bench"
CONCURRENCY = 8


def unavailable() -> str | None:
    """Why BullMQ cannot run here (no Node.js, or no npm to install it), or None."""
    if shutil.which("node") is None:
        return "Node.js is not installed here: BullMQ skipped"
    if not (HERE / "node_modules" / "bullmq").is_dir() and shutil.which("npm") is None:
        return "npm is not installed here: BullMQ cannot be installed, skipped"
    return None


def install(log: Callable[[str], None]) -> None:
    """npm install bench/bullmq's package.json once (node_modules is never committed)."""
    if (HERE / "node_modules" / "bullmq").is_dir() and (HERE / "node_modules" / "ioredis").is_dir():
        return
    log("installing BullMQ with npm (bench/bullmq/node_modules)")
    npm = shutil.which("npm") or "npm"
    done = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--no-package-lock"],
                          cwd=HERE, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise ProcessFailed(f"npm install failed: {done.stderr.strip()[-500:]}")


def versions() -> tuple[str | None, str]:
    """(BullMQ's installed version, node --version)."""
    try:
        version = json.loads((HERE / "node_modules/bullmq/package.json").read_text())["version"]
    except (OSError, ValueError, KeyError):
        version = None
    node = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip()
    return version, node


class BullMQRow(Row):
    key = "bullmq"
    title = "BullMQ"
    clock = "job finishedOn (worker clock, stored with the return value)"

    def unavailable(self) -> str | None:
        return unavailable()

    def prepare(self) -> None:
        install(self.b.log)

    def settings(self) -> dict[str, Any]:
        version, node = versions()
        return {"version": version, "node": node,
                "worker": f"bullmq Worker, concurrency {CONCURRENCY}, one per node process",
                "enqueue_one": "await queue.add", "enqueue_many": "queue.addBulk (all at once)",
                "round_trip": "add(...) then job.waitUntilFinished(queueEvents)"}

    def _keys(self, name: str) -> str:
        return f"{self.ns}:{QUEUE}:{name}"

    def cleanup(self) -> None:
        self.b.target.delete_matching([f"{self.ns}:*"])

    def _node(self, script: str, *args: str) -> list[str]:
        return ["node", str(HERE / script), "--url", self.b.url, "--prefix", self.ns,
                "--queue", QUEUE, *args]

    def _produce(self, mode: str, n: int) -> dict[str, Any]:
        proc = self.b.sup.spawn(f"bullmq-producer-{mode}", self._node("producer.js", "--mode", mode,
                                "--n", str(n)), self.b.env(), piped=True, cwd=HERE)
        try:
            result: dict[str, Any] = json.loads(proc.wait_line("RESULT", 600))
        finally:
            proc.stop(5.0)
        return result

    def enqueue(self, n: int, bulk: bool) -> float:
        return float(self._produce("many" if bulk else "one", n)["elapsed_s"])

    def start_workers(self, count: int) -> Workers:
        procs = [self.b.sup.spawn(f"bullmq-worker-{i + 1}", self._node(
            "worker.js", "--concurrency", str(CONCURRENCY)), self.b.env(), piped=True, cwd=HERE)
            for i in range(count)]
        ready_all(procs)
        return Workers(procs)

    def release(self, ws: Workers) -> None:
        go_all(ws.workers)

    def remaining(self, n: int, ws: Workers) -> int:
        r = self.b.target.r
        pipe = r.pipeline(transaction=False)
        pipe.zcard(self._keys("completed"))
        pipe.zcard(self._keys("failed"))
        completed, failed = pipe.execute()
        if failed:
            raise ProcessFailed(f"BullMQ: {failed} jobs failed")
        return max(0, n - int(completed))

    def drain_times(self, n: int, ws: Workers) -> Drain:
        r = self.b.target.r
        first = r.zrange(self._keys("completed"), 0, 0, withscores=True)
        last = r.zrange(self._keys("completed"), -1, -1, withscores=True)
        return Drain(float(first[0][1]), float(last[0][1]), n, self.clock)

    def round_trips(self, n: int, ws: Workers) -> list[float]:
        return [float(x) for x in self._produce("rt", n)["latencies_ms"]]

    def stop_workers(self, ws: Workers) -> None:
        stop_all(ws.workers, 10.0, command="STOP")
