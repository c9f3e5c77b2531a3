"""Reach: the producer client in this process; workers and the dispatcher as real processes.

Workers are `python -m reach_cli.worker --capability echo --concurrency 8` (the built-in no-op
handler, Reach's default concurrency), the dispatcher is `python -m reach_cli dispatcher`, all
with default settings and only REDIS_URL and REACH_PREFIX set. The workers start first and must
be registered and healthy; the tasks are queued; then the dispatcher starts, which is what
releases the work, so neither worker start-up nor dispatcher start-up is timed. Drain times are
the task records' `finished_at` (Redis server clock, written in the same script that stores the
result).
"""

from __future__ import annotations

import time
from typing import Any

from bench.context import Bench
from bench.procs import Proc, ProcessFailed
from bench.rows.base import Drain, Row, Workers, payload
from broker import ReachClient
from broker.keys import CapabilityKeys, RegistryKeys
from broker.registry import AgentRecord, AgentState, agent_state, server_ms
from broker.scripts import SCRIPT_NAMES, source
from broker.settings import Settings

CAPABILITY = "echo"


class ReachRow(Row):
    key = "reach"
    title = "Reach"
    clock = "task record finished_at (Redis server clock)"

    def __init__(self, bench: Bench) -> None:
        super().__init__(bench)
        self.client: ReachClient | None = None
        self.task_ids: list[str] = []

    def settings(self) -> dict[str, Any]:
        return {
            "worker": f"python -m reach_cli.worker --capability echo --concurrency "
                      f"{self.b.opts.reach_concurrency} (built-in no-op async handler)",
            "dispatcher": "python -m reach_cli dispatcher (one process)",
            "settings": "defaults (REACH_PREFIX and REDIS_URL only)",
            "enqueue_one": "ReachClient.submit", "enqueue_many": "ReachClient.submit_many",
            "round_trip": "submit(...).result(timeout)",
        }

    def prepare(self) -> None:
        preload_scripts(self.b)

    # -- namespace --------------------------------------------------------------------------

    def begin(self) -> None:
        super().begin()
        self.reach_settings = Settings.load(redis_url=self.b.url, prefix=self.ns)
        if self.client is not None:
            self.client.close()
        self.client = ReachClient(self.reach_settings)
        self.client.queue_depth(CAPABILITY)  # connect before anything is timed
        self.keys = CapabilityKeys(self.ns, CAPABILITY)
        self.task_ids = []

    def cleanup(self) -> None:
        self.b.target.delete_matching([f"{self.ns}:*"])

    # -- producing --------------------------------------------------------------------------

    def enqueue(self, n: int, bulk: bool) -> float:
        assert self.client is not None
        client = self.client
        start = time.perf_counter()
        if bulk:
            handles = client.submit_many(CAPABILITY, [payload(i) for i in range(n)])
        else:
            handles = [client.submit(CAPABILITY, payload(i)) for i in range(n)]
        elapsed = time.perf_counter() - start
        self.task_ids += [h.task_id for h in handles]
        return elapsed

    def round_trips(self, n: int, ws: Workers) -> list[float]:
        assert self.client is not None
        out = []
        for i in range(n):
            start = time.perf_counter()
            handle = self.client.submit(CAPABILITY, payload(i))
            handle.result(timeout=30)
            out.append((time.perf_counter() - start) * 1000)
        return out

    # -- processes --------------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        # (no metrics server: a dispatcher serves one on 127.0.0.1:9464 by default; the
        # `reach-metrics` row measures Reach with them)
        return self.b.env(REDIS_URL=self.b.url, REACH_PREFIX=self.ns, REACH_METRICS_ADDR="off")

    def process_args(self, name: str) -> list[str]:
        """More arguments for the process `name` starts (the metrics row's addresses)."""
        return []

    def start_workers(self, count: int, *, handler: str | None = None,
                      concurrency: int | None = None) -> Workers:
        procs = []
        ids = []
        for i in range(count):
            agent_id = f"{self.ns}-w{i + 1}"
            argv = self.b.python("reach_cli.worker", "--capability", CAPABILITY, "--agent-id", agent_id,
                                 "--concurrency", str(concurrency or self.b.opts.reach_concurrency),
                                 *self.process_args(agent_id))
            if handler:
                argv += ["--handler", handler]
            procs.append(self.b.sup.spawn(f"reach-worker-{agent_id}", argv, self.env()))
            ids.append(agent_id)
        wait_healthy(self.b.target.r, self.reach_settings, ids, procs)
        return Workers(procs)

    def release(self, ws: Workers) -> None:
        """Start the dispatcher; return once it routed its first tasks (start-up is over)."""
        depth_before = self.b.target.r.zcard(self.keys.queue)
        proc = self.b.sup.spawn("reach-dispatcher", self.b.python(
            "reach_cli", "dispatcher", *self.process_args("dispatcher")), self.env())
        ws.helpers.append(proc)
        deadline = time.monotonic() + 60
        while self.b.target.r.zcard(self.keys.queue) >= depth_before > 0:
            proc.check_alive()
            if time.monotonic() > deadline:
                raise ProcessFailed(f"the dispatcher routed nothing in 60s (log: {proc.log_path})")
            time.sleep(0.001)

    def remaining(self, n: int, ws: Workers) -> int:
        """Queued + retrying + in inboxes (an inbox entry is deleted by the script that stores
        the task's result, so this reaches 0 exactly when every result is stored)."""
        r = self.b.target.r
        pipe = r.pipeline(transaction=False)
        pipe.zcard(self.keys.queue)
        pipe.zcard(self.keys.delayed)
        pipe.smembers(self.keys.inboxes)
        queued, delayed, agents = pipe.execute()
        pipe = r.pipeline(transaction=False)
        for agent in agents:
            pipe.xlen(self.keys.inbox(agent))
        return int(queued) + int(delayed) + sum(int(x) for x in pipe.execute())

    def drain_times(self, n: int, ws: Workers) -> Drain:
        records = self.records(self.task_ids[-n:], ("state", "finished_at"))
        bad = [r for r in records if r[0] != "succeeded"]
        if bad:
            raise ProcessFailed(f"Reach: {len(bad)} of {n} tasks did not succeed (e.g. {bad[0]})")
        finished = [float(r[1]) for r in records]
        return Drain(min(finished), max(finished), n, self.clock)

    def records(self, task_ids: list[str], fields: tuple[str, ...]) -> list[list[Any]]:
        """HMGET `fields` of each task record, pipelined."""
        r = self.b.target.r
        out: list[list[Any]] = []
        for start in range(0, len(task_ids), 5000):
            pipe = r.pipeline(transaction=False)
            for task_id in task_ids[start:start + 5000]:
                pipe.hmget(self.keys.task(task_id.split(":", 1)[1]), fields)
            out += pipe.execute()
        return out


def preload_scripts(bench: Bench) -> None:
    """Load Reach's scripts once so that no timed call pays for a NOSCRIPT round trip."""
    for name in SCRIPT_NAMES:
        bench.target.r.script_load(source(name))


def wait_healthy(r: Any, settings: Settings, agent_ids: list[str], procs: list[Proc],
                 timeout: float = 60.0) -> None:
    """Until every agent is registered and healthy by the server clock (`r`: a redis-py client
    that decodes responses)."""
    keys = RegistryKeys(settings.prefix)
    deadline = time.monotonic() + timeout
    while True:
        for proc in procs:
            proc.check_alive()
        now = server_ms(r.time())
        pipe = r.pipeline(transaction=False)
        for agent_id in agent_ids:
            pipe.hgetall(keys.agent(agent_id))
        healthy = 0
        for data in pipe.execute():
            record = AgentRecord.from_hash(data) if data else None
            if record is not None and agent_state(record, now, settings) is AgentState.HEALTHY:
                healthy += 1
        if healthy == len(agent_ids):
            return
        if time.monotonic() > deadline:
            raise ProcessFailed(f"{len(agent_ids) - healthy} Reach worker(s) not healthy after "
                                f"{timeout:.0f}s (logs: {procs[0].log_path.parent})")
        time.sleep(0.02)
