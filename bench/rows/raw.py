"""The raw redis-py Streams loop: the physical limit of a Streams queue driven from Python.

Producer: XADD one at a time, or pipelined in batches of 1,000 for the bulk figure. Workers:
bench/workers/raw_worker.py (XREADGROUP COUNT 100 + per-task result write + XACK, pipelined).
Round trip: XADD, then BLPOP on the task's result list. No retries, leases, fencing, routing or
events: everything Reach adds on top is what the gap to this row pays for.
"""

from __future__ import annotations

import json
import time
from typing import Any

from bench.procs import stop_all
from bench.rows.base import Drain, Row, Workers, go_all, launcher_drain, payload, ready_all
from bench.workers.raw_worker import GROUP, keys, result_key

BULK_BATCH = 1000


class RawRow(Row):
    key = "raw"
    title = "raw redis-py Streams"
    clock = "Redis TIME read in each batch's result pipeline"

    def settings(self) -> dict[str, Any]:
        return {"worker": "XREADGROUP COUNT 100 BLOCK 100, pipeline: RPUSH+PEXPIRE result per "
                          "task, XACK batch, INCRBY done, TIME",
                "enqueue_many": f"pipelined XADD, batches of {BULK_BATCH}",
                "round_trip": "XADD then BLPOP on the task's result list"}

    def begin(self) -> None:
        super().begin()
        self.stream, self.done = keys(self.ns)
        self.b.target.r.xgroup_create(self.stream, GROUP, id="0", mkstream=True)

    def cleanup(self) -> None:
        self.b.target.delete_matching([f"{self.ns}:*"])

    def enqueue(self, n: int, bulk: bool) -> float:
        r = self.b.target.r
        start = time.perf_counter()
        if bulk:
            for first in range(0, n, BULK_BATCH):
                pipe = r.pipeline(transaction=False)
                for i in range(first, min(n, first + BULK_BATCH)):
                    pipe.xadd(self.stream, {"d": json.dumps(payload(i))})
                pipe.execute()
        else:
            for i in range(n):
                r.xadd(self.stream, {"d": json.dumps(payload(i))})
        return time.perf_counter() - start

    def start_workers(self, count: int) -> Workers:
        procs = [self.b.sup.spawn(f"raw-worker-{i + 1}", self.b.python(
            "bench.workers.raw_worker", "--url", self.b.url, "--prefix", self.ns,
            "--consumer", f"c{i + 1}"), self.b.env(), piped=True) for i in range(count)]
        ready_all(procs)
        return Workers(procs)

    def release(self, ws: Workers) -> None:
        go_all(ws.workers)

    def remaining(self, n: int, ws: Workers) -> int:
        return max(0, n - int(self.b.target.r.get(self.done) or 0))

    def drain_times(self, n: int, ws: Workers) -> Drain:
        return launcher_drain(ws.workers, n, self.clock)

    def round_trips(self, n: int, ws: Workers) -> list[float]:
        r = self.b.target.r
        out = []
        for i in range(n):
            start = time.perf_counter()
            entry_id = r.xadd(self.stream, {"d": json.dumps(payload(i))})
            if r.blpop([result_key(self.ns, entry_id)], timeout=30) is None:
                raise TimeoutError("raw round trip: no result within 30s")
            out.append((time.perf_counter() - start) * 1000)
        return out

    def stop_workers(self, ws: Workers) -> None:
        stop_all(ws.workers, 5.0, command="STOP")
