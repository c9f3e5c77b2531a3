"""dramatiq with its Redis broker and the Results middleware (Redis backend).

Producer: `actor.send(payload)` in this process (dramatiq has no bulk enqueue: its figure is
left empty). Workers: bench/workers/dramatiq_worker.py, one `dramatiq.Worker` per process with
its default 8 worker threads and default prefetch. Round trip: `send(...)` then
`message.get_result(block=True)`. Drain times are taken by the worker right after Results
stored each result (the machine's clock; no Redis timestamp exists for them).
"""

from __future__ import annotations

import importlib.util
import time
from typing import Any

from bench.procs import stop_all
from bench.rows.base import Drain, Row, Workers, go_all, launcher_drain, payload, ready_all
from bench.workers.dramatiq_worker import QUEUE, build

THREADS = 8


class DramatiqRow(Row):
    key = "dramatiq"
    title = "dramatiq"
    clock = "worker wall clock right after Results stored the result"
    bulk_note = "dramatiq has no bulk enqueue"

    def unavailable(self) -> str | None:
        if importlib.util.find_spec("dramatiq") is None:
            return "dramatiq is not installed (pip install 'agent-reach[bench]')"
        return None

    def settings(self) -> dict[str, Any]:
        import dramatiq

        return {"version": dramatiq.__version__,
                "worker": f"dramatiq.Worker(RedisBroker + Results(RedisBackend), "
                          f"worker_threads={THREADS}) per process, default prefetch",
                "enqueue_one": "actor.send", "round_trip": "send().get_result(block=True)"}

    def begin(self) -> None:
        super().begin()
        self.broker, self.backend, self.actor = build(self.b.url, self.ns)
        self.broker.client.ping()
        self.backend.client.ping()
        self.result_keys: list[str] = []

    def cleanup(self) -> None:
        self.b.target.delete_matching([f"{self.ns}:*", f"{self.ns}-results:*"])
        # Result keys are hashes of the message, not prefixed: delete the ones we made.
        self.b.target.delete_keys(self.result_keys)
        self.broker.client.close()
        self.backend.client.close()

    def enqueue(self, n: int, bulk: bool) -> float | None:
        if bulk:
            return None
        start = time.perf_counter()
        messages = [self.actor.send(payload(i)) for i in range(n)]
        elapsed = time.perf_counter() - start
        self.result_keys += [self.backend.build_message_key(m) for m in messages]
        return elapsed

    def start_workers(self, count: int) -> Workers:
        procs = [self.b.sup.spawn(f"dramatiq-worker-{i + 1}", self.b.python(
            "bench.workers.dramatiq_worker", "--url", self.b.url, "--namespace", self.ns,
            "--threads", str(THREADS)), self.b.env(), piped=True) for i in range(count)]
        ready_all(procs)
        return Workers(procs)

    def release(self, ws: Workers) -> None:
        go_all(ws.workers)

    def remaining(self, n: int, ws: Workers) -> int:
        # A message leaves this hash when it is acked, after Results stored its result.
        return int(self.b.target.r.hlen(f"{self.ns}:{QUEUE}.msgs"))

    def drain_times(self, n: int, ws: Workers) -> Drain:
        return launcher_drain(ws.workers, n, self.clock)

    def round_trips(self, n: int, ws: Workers) -> list[float]:
        out = []
        for i in range(n):
            start = time.perf_counter()
            message = self.actor.send(payload(i))
            message.get_result(backend=self.backend, block=True, timeout=30_000)
            out.append((time.perf_counter() - start) * 1000)
            self.result_keys.append(self.backend.build_message_key(message))
        return out

    def stop_workers(self, ws: Workers) -> None:
        stop_all(ws.workers, 10.0, command="STOP")
