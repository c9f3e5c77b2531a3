"""Dispatcher routing decisions per second with 10, 100 and 1,000 registered agents.

Two measurements, because they answer different questions:

1. **The real dispatcher process, end to end** (the headline figure). Simulated agents are
   registered, bound and kept alive through Reach's own scripts (register, bind, heartbeat every
   3 s, reporting what an idle echo worker reports); `dispatch_tasks` tasks are queued; a
   lightweight consumer process (bench/workers/sim_consumer.py) drains the agents' inboxes and
   sends the same `free` wake-ups as the complete script, in one of two ways: emptying the
   inboxes the dispatch calls wrote to (`trim`, the headline: the stand-in costs Redis as little
   as it can, so the figure is the dispatcher's) or reading them through the group as agents do
   (`read`, kept beside it: on two cores, that reading costs Redis's core about as much per task
   as the dispatch itself). Then `python -m reach_cli dispatcher`
   starts, pinned to one core (CPU 0; Redis and the consumer are pinned to CPU 1 meanwhile when
   the harness owns Redis). A decision = a task handed to an agent's inbox by dispatch.lua; the
   rate is (n-1) / (last dispatched_at - first dispatched_at) from the task records (server
   clock). The dispatcher's CPU use over the same span says whether it was CPU-bound or waiting
   for Redis.
2. **The routing code alone, in process**: rounds as `CapabilityLoop.route` makes them, minus
   Redis: the dispatcher's own `Observations.candidates()`, a `RoutingRound`, as many ready
   tasks as it takes in one round (`routing.round_tasks`), a choice and an explanation per task,
   over the same number of healthy agents, timed with process CPU time: the ceiling the
   pure-Python choice sets.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import threading
import time
from typing import Any

from bench.context import Bench
from bench.procs import Proc, ProcessFailed, set_affinity
from bench.rows.base import STALL_S, payload, ready_all
from bench.rows.reach import preload_scripts
from bench.workers.sim_consumer import agent_ids
from broker import ReachClient
from broker.keys import CapabilityKeys
from broker.models import AgentDescriptor
from broker.protocol.agents import bind_call, heartbeat_call, register_call
from broker.protocol.grants import Explanation
from broker.registry import AgentRecord
from broker.scripts import Scripts
from broker.settings import Settings
from dispatcher import routing
from dispatcher.context import DispatcherContext
from dispatcher.observations import Observations

CAP = "sim"
STAND_INS = {"trim": "empty their inboxes", "read": "read through the group"}
CONCURRENCY = 8
HEARTBEAT_S = 3.0


def idle_stats() -> dict[str, Any]:
    """What an idle `echo` worker reports in its heartbeat (p50 0 ms: a no-op)."""
    return {"inflight": 0, "max_concurrency": CONCURRENCY, "loop_progress_age_ms": 0,
            "loop_lag_ms": 0.0, "latency_p50_ms": 0, "done": 0, "failed": 0, "rejected": 0,
            "rss_kb": None, "draining": False}


class SimulatedAgents:
    """Registers agents through Reach's scripts and heartbeats them from a thread."""

    def __init__(self, bench: Bench, settings: Settings, count: int) -> None:
        self.settings = settings
        self.r = bench.target.r
        self.scripts = Scripts(self.r)
        self.ids = agent_ids(count)
        self.tokens: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat_forever, name="sim-heartbeats", daemon=True)

    def register(self) -> None:
        from agent_worker.registration import new_token

        for start in range(0, len(self.ids), 200):
            pipe = self.r.pipeline(transaction=False)
            for agent_id in self.ids[start:start + 200]:
                token, sha = new_token()
                self.tokens[agent_id] = token
                descriptor = AgentDescriptor(agent_id=agent_id, capabilities=[CAP],
                                             max_concurrency=CONCURRENCY, host="bench", pid=0)
                self.scripts(register_call(self.settings, agent_id, sha,
                                                    descriptor.model_dump_json(), 0, [CAP]), client=pipe)
                self.scripts(bind_call(self.settings, CAP, agent_id, sha), client=pipe)
            pipe.execute()
        self.beat()
        self._thread.start()

    def beat(self) -> None:
        stats = idle_stats()
        for start in range(0, len(self.ids), 500):
            pipe = self.r.pipeline(transaction=False)
            for agent_id in self.ids[start:start + 500]:
                self.scripts(heartbeat_call(self.settings, agent_id, self.tokens[agent_id],
                                                     stats), client=pipe)
            pipe.execute()

    def _beat_forever(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            with contextlib.suppress(Exception):
                self.beat()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)


def _start_consumer(bench: Bench, settings: Settings, sim: SimulatedAgents, env: dict[str, str],
                    agents: int, tasks: int, stand_in: str, two_cores: bool,
                    procs: list[Proc]) -> tuple[list[str], Proc]:
    """Registers the simulated agents, queues `tasks` tasks and starts the stand-in consumer
    (added to `procs` as soon as it exists, so the caller's cleanup kills it)."""
    preload_scripts(bench)
    sim.register()
    with ReachClient(settings) as client:
        task_ids = [h.task_id for h in client.submit_many(CAP, [payload(i) for i in range(tasks)])]
    consumer = bench.sup.spawn(f"sim-consumer-{agents}", bench.python(
        "bench.workers.sim_consumer", "--url", bench.url, "--prefix", settings.prefix, "--cap", CAP,
        "--agents", str(agents), "--mode", stand_in), env, piped=True, cpus={1} if two_cores else None)
    procs.append(consumer)
    ready_all([consumer])
    consumer.send("GO")
    return task_ids, consumer


def _wait_for_drain(bench: Bench, keys: CapabilityKeys, tasks: int, dispatcher: Proc,
                    consumer: Proc) -> tuple[float, float, float]:
    """Waits until the dispatcher has routed every queued task, failing if it stalls.
    Returns the dispatcher's CPU seconds and the wall seconds from its first decision to the
    empty queue, and the consumer's CPU seconds over the same time."""
    r = bench.target.r
    deadline = time.monotonic() + 120 + tasks / 100
    while r.zcard(keys.queue) >= tasks:
        dispatcher.check_alive()
        if time.monotonic() > deadline:
            raise ProcessFailed(f"dispatcher routed nothing (log: {dispatcher.log_path})")
        time.sleep(0.001)
    cpu0, t0 = dispatcher.cpu_seconds() or 0.0, time.monotonic()
    consumer_cpu0 = consumer.cpu_seconds() or 0.0
    last, moved_at = tasks + 1, t0
    while (left := r.zcard(keys.queue)) > 0:
        dispatcher.check_alive()
        consumer.check_alive()
        now = time.monotonic()
        if left != last:
            last, moved_at = left, now
        elif now - moved_at > STALL_S or now > deadline:
            raise ProcessFailed(f"dispatcher stalled with {left:,} of {tasks:,} tasks queued "
                                f"(log: {dispatcher.log_path})")
        time.sleep(0.005)
    cpu1, t1 = dispatcher.cpu_seconds() or 0.0, time.monotonic()
    consumer_cpu = (consumer.cpu_seconds() or 0.0) - consumer_cpu0
    return cpu1 - cpu0, t1 - t0, consumer_cpu


def _dispatch_rate(bench: Bench, keys: CapabilityKeys, task_ids: list[str], tasks: int) -> float | None:
    """Decisions per second from the tasks' own dispatched_at stamps (first to last)."""
    pipe = bench.target.r.pipeline(transaction=False)
    for task_id in task_ids:
        pipe.hget(keys.task(task_id.split(":", 1)[1]), "dispatched_at")
    stamps = [float(s) for s in pipe.execute() if s]
    if len(stamps) < tasks:
        raise ProcessFailed(f"only {len(stamps)} of {tasks} tasks were dispatched")
    span_s = (max(stamps) - min(stamps)) / 1000
    return (tasks - 1) / span_s if span_s > 0 else None


def measure_process(bench: Bench, agents: int, tasks: int, stand_in: str = "trim") -> dict[str, Any]:
    """The real dispatcher process routing `tasks` queued tasks to `agents` simulated agents,
    whose inboxes the stand-in consumer drains the `stand_in` way (see sim_consumer.py)."""
    prefix = bench.prefix(f"disp{agents}")
    settings = Settings.load(redis_url=bench.url, prefix=prefix)
    keys = CapabilityKeys(prefix, CAP)
    sim = SimulatedAgents(bench, settings, agents)
    two_cores = len(os.sched_getaffinity(0)) >= 2
    pinned_redis = False
    procs: list[Proc] = []
    try:
        env = bench.env(REDIS_URL=bench.url, REACH_PREFIX=prefix)
        task_ids, consumer = _start_consumer(bench, settings, sim, env, agents, tasks, stand_in,
                                             two_cores, procs)
        if two_cores and bench.target.pid is not None:
            set_affinity(bench.target.pid, {1})
            pinned_redis = True
        before = bench.target.snapshot()
        dispatcher = bench.sup.spawn(f"dispatcher-{agents}-agents", bench.python(
            "reach_cli", "dispatcher", "--capability", CAP), env, cpus={0} if two_cores else None)
        procs.append(dispatcher)
        cpu_s, wall_s, consumer_cpu = _wait_for_drain(bench, keys, tasks, dispatcher, consumer)
        after = bench.target.snapshot()
        dispatcher.stop(5.0)
        consumer.stop(5.0, command="STOP")
        rate = _dispatch_rate(bench, keys, task_ids, tasks)
        util = cpu_s / wall_s if wall_s > 0 else None
        return {
            "agents": agents,
            "tasks": tasks,
            "stand_in": stand_in,
            "decisions_per_s": rate,
            "dispatcher_cpu_util": round(util, 3) if util is not None else None,
            "decisions_per_cpu_s": round(rate / util, 1) if rate and util else None,
            # The consumer shares Redis's core: what it costs there, per task.
            "consumer_cpu_us_per_task": round(consumer_cpu * 1e6 / tasks, 1),
            "redis": after.delta(before, tasks),
            "pinned": two_cores,
        }
    finally:
        sim.stop()
        if pinned_redis and bench.target.pid is not None:
            set_affinity(bench.target.pid, None)
        for proc in procs:
            proc.kill()
        bench.target.delete_matching([f"{prefix}:*"])


def measure_routing_cpu(agents: int, seconds: float) -> dict[str, Any]:
    """Decisions per CPU-second of the routing code alone (no Redis, no I/O).

    This drives the dispatcher's parts (Observations, RoutingRound, round_tasks), which change
    as routing evolves: when they no longer fit, the figure is reported as missing with a note
    instead of failing the run (the process figure above does not depend on them).
    """
    try:
        return _routing_cpu(agents, seconds)
    except (AttributeError, TypeError, ValueError, KeyError) as exc:
        return {"agents": agents, "decisions_per_cpu_s": None,
                "note": f"routing internals changed ({type(exc).__name__}: {exc}); "
                        "update bench/dispatch_bench.py"}


def _routing_cpu(agents: int, seconds: float) -> dict[str, Any]:
    settings = Settings.load(redis_url="redis://unused:1/0", prefix="bench-routing")
    ctx = DispatcherContext.connect(settings)
    view = ctx.view
    now = int(time.time() * 1000)
    view._offset_ms = now - time.monotonic() * 1000
    view.agents = {}
    for agent_id in agent_ids(agents):
        record = AgentRecord.from_hash({
            "agent_id": agent_id, "last_seen": str(now), "registered_at": str(now),
            "warm_until": str(now), "mode": "active", "stats": json.dumps(idle_stats()),
            "descriptor": AgentDescriptor(agent_id=agent_id, capabilities=[CAP],
                                          max_concurrency=CONCURRENCY).model_dump_json(),
        })
        assert record is not None
        view.agents[agent_id] = record
    seen = Observations(ctx, CAP)
    ids = [f"{i:026d}" for i in range(routing.MAX_ROUND_TASKS)]
    rng = random.Random(1)
    decisions = 0
    start = time.process_time()
    while time.process_time() - start < seconds:
        # One routing round as CapabilityLoop.route makes it, minus the Redis calls.
        candidates, filtered = seen.candidates()
        round_ = routing.RoutingRound(candidates, settings, now, rng, seen.probes, filtered)
        plan: dict[str, list[tuple[str, str]]] = {}
        for local_id in ids[:routing.round_tasks(round_, settings)]:
            choice = round_.choose(routing.ReadyTask(local_id, 5))
            if choice is not None:
                why = Explanation("r1", choice.why, choice.score, choice.eligible).encode()
                plan.setdefault(choice.agent_id, []).append((local_id, why))
        for agent_id, items in plan.items():
            seen.note_load(agent_id, len(items), 0)
            decisions += len(items)
        seen.loads.clear()  # the simulated agents finish everything before the next round
    elapsed = time.process_time() - start
    return {"agents": agents, "decisions_per_cpu_s": round(decisions / elapsed, 1)}


def run(bench: Bench, reps: int) -> dict[str, Any]:
    """`process`: the headline figure, with stand-in agents that finish everything at once and
    cost Redis as little as a stand-in can (`trim`); `process_read`: the same with stand-ins that
    read their inboxes through the group as agents do, which costs Redis's core about as much
    per task as the dispatch itself (see sim_consumer.py). The two take turns, in ABBA order
    over the repetitions, so that a drift of the machine hits both alike."""
    out: dict[str, Any] = {"process": {}, "process_read": {}, "routing_code": {}}
    seconds = 0.1 if bench.opts.smoke else 1.0
    for count in bench.sizes.agents:
        runs: dict[str, list[dict[str, Any]]] = {"trim": [], "read": []}
        for rep in range(reps):
            for stand_in in ("trim", "read") if rep % 2 == 0 else ("read", "trim"):
                kept = runs[stand_in]
                bench.log(f"dispatcher: {count:,} agents, {bench.sizes.dispatch_tasks:,} tasks, "
                          f"stand-in agents that {STAND_INS[stand_in]} (rep {rep + 1}/{reps})")
                kept.append(measure_process(bench, count, bench.sizes.dispatch_tasks, stand_in))
        out["process"][str(count)] = runs["trim"]
        out["process_read"][str(count)] = runs["read"]
        out["routing_code"][str(count)] = [measure_routing_cpu(count, seconds) for _ in range(reps)]
    return out
