"""rq, with its default `Worker` (a forked work horse per job) and with `SimpleWorker`.

Producer: `Queue.enqueue` one at a time and `Queue.enqueue_many` for the bulk figure, in this
process. Workers: bench/workers/rq_worker.py, one per process. Round trip: `enqueue(...)` then
`job.latest_result(timeout=...)`, which blocks on the job's result stream. Drain times are the
result streams' entry ids (Redis server clock, written with the result); rq versions without
result streams fall back to the job's `ended_at`. All keys carry the run's RQ_KEY_PREFIX.
"""

from __future__ import annotations

import importlib.util
import os
import time
from datetime import datetime
from typing import Any, ClassVar

from bench.context import Bench
from bench.procs import ProcessFailed, stop_all
from bench.rows.base import Drain, Row, Workers, go_all, payload, ready_all


def rq_prefix(bench: Bench) -> str:
    return f"bench-{bench.tag}-rq"


class RqRow(Row):
    key = "rq-worker"
    title = "rq Worker"
    kind = "worker"
    clock = "result stream entry id (Redis server clock)"
    # A fork per job, ~20-40 jobs/s here: 10,000 would take 15 minutes a repetition.
    max_n: ClassVar[int | None] = 2_000

    def __init__(self, bench: Bench) -> None:
        super().__init__(bench)
        self.job_ids: list[str] = []

    def unavailable(self) -> str | None:
        if importlib.util.find_spec("rq") is None:
            return "rq is not installed (pip install 'agent-reach[bench]')"
        # The harness sets RQ_KEY_PREFIX before rq is imported; older rq ignores it and writes
        # under 'rq:', which is only acceptable on a server the harness owns.
        from rq import defaults

        if getattr(defaults, "RQ_KEY_PREFIX", "rq") != rq_prefix(self.b) and not self.b.target.owned:
            return "this rq version cannot prefix its keys; run it on the harness's own Redis"
        return None

    def settings(self) -> dict[str, Any]:
        import rq

        return {"version": rq.__version__,
                "worker": f"rq.{'SimpleWorker' if self.kind == 'simple' else 'Worker'} per process",
                "enqueue_one": "Queue.enqueue", "enqueue_many": "Queue.enqueue_many",
                "round_trip": "enqueue(...).latest_result(timeout)"}

    def begin(self) -> None:
        from redis import Redis
        from rq import Queue

        super().begin()
        self.conn = Redis.from_url(self.b.url)
        self.conn.ping()
        self.queue = Queue(self.ns, connection=self.conn)
        self.job_ids = []

    def cleanup(self) -> None:
        from rq import defaults

        prefix = getattr(defaults, "RQ_KEY_PREFIX", "rq")
        if prefix == rq_prefix(self.b):
            self.b.target.delete_matching([f"{prefix}:*"])
        else:  # old rq on our own server
            self.b.target.delete_matching(["rq:*"])
        self.conn.close()

    def enqueue(self, n: int, bulk: bool) -> float:
        from bench.workers.tasks import noop

        start = time.perf_counter()
        if bulk:
            jobs = self.queue.enqueue_many(
                [self.queue.prepare_data(noop, (payload(i),)) for i in range(n)])
        else:
            jobs = [self.queue.enqueue(noop, payload(i)) for i in range(n)]
        elapsed = time.perf_counter() - start
        self.job_ids += [job.id for job in jobs]
        return elapsed

    def start_workers(self, count: int) -> Workers:
        procs = [self.b.sup.spawn(f"rq-{self.kind}-{i + 1}", self.b.python(
            "bench.workers.rq_worker", "--url", self.b.url, "--queue", self.ns, "--kind", self.kind,
            "--name", f"{self.ns}-{i + 1}"), self.b.env(), piped=True) for i in range(count)]
        ready_all(procs)
        return Workers(procs)

    def release(self, ws: Workers) -> None:
        go_all(ws.workers)

    def remaining(self, n: int, ws: Workers) -> int:
        return max(0, n - int(self.conn.zcard(self.queue.finished_job_registry.key)))

    def drain_times(self, n: int, ws: Workers) -> Drain:
        from rq.results import Result

        ids = self.job_ids[-n:]
        stamps: list[float] = []
        pipe = self.conn.pipeline(transaction=False)
        for job_id in ids:
            pipe.xrevrange(Result.get_key(job_id), "+", "-", count=1)  # type: ignore[no-untyped-call]
        for reply in pipe.execute():
            if reply:
                stamps.append(float(reply[0][0].decode().split("-")[0]))
        clock = self.clock
        if len(stamps) < n:  # rq without result streams: the job's ended_at (worker clock)
            stamps = [self._ended_ms(job_id) for job_id in ids]
            clock = "job ended_at (worker clock)"
        if len(stamps) < n:
            raise ProcessFailed(f"{self.title}: only {len(stamps)} of {n} results found")
        return Drain(min(stamps), max(stamps), n, clock)

    def _ended_ms(self, job_id: str) -> float:
        from rq.job import Job

        ended = Job.fetch(job_id, connection=self.conn).ended_at
        if ended is None:
            raise ProcessFailed(f"{self.title}: job {job_id} has no ended_at")
        return ended.timestamp() * 1000 if isinstance(ended, datetime) else float(ended)

    def round_trips(self, n: int, ws: Workers) -> list[float]:
        from rq.results import Result

        from bench.workers.tasks import noop

        out = []
        for i in range(n):
            start = time.perf_counter()
            job = self.queue.enqueue(noop, payload(i))
            result = job.latest_result(timeout=30)
            if result is None or result.type != Result.Type.SUCCESSFUL:
                raise ProcessFailed(f"{self.title}: round trip got {result!r}")
            out.append((time.perf_counter() - start) * 1000)
            self.job_ids.append(job.id)
        return out

    def stop_workers(self, ws: Workers) -> None:
        stop_all(ws.workers, 10.0)  # SIGTERM: rq's warm shutdown


class RqSimpleRow(RqRow):
    max_n = None
    key = "rq-simple"
    title = "rq SimpleWorker"
    kind = "simple"


def set_rq_prefix(bench: Bench) -> None:
    """Must run before rq is first imported (by this process and, through env, by workers)."""
    os.environ["RQ_KEY_PREFIX"] = rq_prefix(bench)
