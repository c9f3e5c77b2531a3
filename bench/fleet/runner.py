"""One system through one scenario: a fresh Redis, the fleet, the producer, the timeline.

The order: a private redis-server; every agent (but a late joiner) with its control file; the
agents ready; helpers (Reach's dispatcher); the producer, connected (READY); then `GO t0` with t0
half a second ahead, and the harness plays the scenario's events at their times after t0 while
the producer submits. Once the producer wrote its outcomes (every one seen, or its deadline
passed), every process is stopped (a frozen one continued first) and the Redis thrown away.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.context import child_env, python
from bench.fleet import metrics
from bench.fleet.scenarios import Event, Scenario, Timings
from bench.fleet.systems import RunContext, System
from bench.fleet.workload import Workload, write_plan
from bench.procs import Proc, ProcessFailed, Supervisor
from bench.target import Target

LEAD_MS = 500.0
"""How far ahead of GO the producer's first task is due (so that every part starts on time)."""
SETTLE_S = 2.0
"""After the last outcome of a scenario with events: time for late executions to end and report."""


@dataclass
class FleetOptions:
    workload: Workload
    timings: Timings
    deadline_s: float
    """Seconds after the last submit that a producer waits for outstanding outcomes."""
    log_dir: Path
    redis_server: str | None = None
    reach_env: dict[str, str] = field(default_factory=dict)


def write_control(path: Path, control: dict[str, Any]) -> None:
    """Replace an agent's control file at once (agents re-read it when its mtime changes)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(control))
    os.replace(tmp, path)


class Run:
    """The processes and marks of one system in one scenario."""

    def __init__(self, system: System, scenario: Scenario, opts: FleetOptions) -> None:
        self.system, self.scenario, self.opts = system, scenario, opts
        self.run_dir = system.ctx.run_dir
        self.agents: dict[str, Proc] = {}
        self.helpers: list[Proc] = []
        self.stopped: set[str] = set()
        self.marks: dict[str, float] = {}
        self.controls: dict[str, dict[str, Any]] = {}

    def agent_env(self, name: str) -> dict[str, str]:
        return {"FLEET_AGENT": name, "FLEET_LOG": str(self.run_dir / f"exec-{name}.log"),
                "FLEET_CONTROL": str(self.run_dir / f"control-{name}.json")}

    def start_agent(self, name: str) -> None:
        self.agents[name] = self.system.start_agent(name, self.agent_env(name))

    def start_fleet(self) -> None:
        for name in self.scenario.agents(self.opts.workload):
            self.controls[name] = self.scenario.control(name, self.opts.timings)
            write_control(self.run_dir / f"control-{name}.json", self.controls[name])
            if name not in self.scenario.late:
                self.start_agent(name)
        self.system.wait_ready(self.agents)
        self.helpers = self.system.start_helpers()

    def act(self, event: Event) -> None:
        name = event.agent
        self.marks[f"{event.action}:{name}"] = time.time() * 1000
        if event.action == "slow":
            self.controls[name] = {**self.controls[name], "slow_from_ms": time.time() * 1000}
            write_control(self.run_dir / f"control-{name}.json", self.controls[name])
        elif event.action == "join":
            self.start_agent(name)
        else:
            sig = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP, "cont": signal.SIGCONT}[event.action]
            os.killpg(self.agents[name].pid, sig)
            if event.action == "stop":
                self.stopped.add(name)
            elif event.action == "cont":
                self.stopped.discard(name)

    def play(self, producer: Proc, t0: float) -> str:
        """Play every event, also after the producer has every outcome (a frozen agent thawed
        late still reports, and a result the system accepts then would be a duplicate); the
        path the producer's RESULT line names."""
        w = self.opts.workload
        pending = sorted(self.scenario.events, key=lambda e: e.at_s(w))
        end = t0 / 1000 + w.seconds + self.opts.deadline_s + 60
        while pending:
            due = t0 / 1000 + pending[0].at_s(w)
            while time.time() < due:
                if producer.popen.poll() not in (None, 0):
                    producer.check_alive()  # (raises, with the producer's log)
                time.sleep(min(0.01, max(0.0, due - time.time())))
            self.act(pending.pop(0))
        path = producer.wait_line("RESULT", max(5.0, end - time.time()))
        if self.scenario.events:
            time.sleep(SETTLE_S)
        return path

    def stop(self) -> None:
        for name in self.stopped:
            os.killpg(self.agents[name].pid, signal.SIGCONT)
        alive = [p for p in self.agents.values() if p.alive()]
        self.system.stop(alive, self.helpers)


def run_one(system_cls: type[System], scenario: Scenario, opts: FleetOptions, sup: Supervisor,
            log: Callable[[str], None]) -> dict[str, Any]:
    """Run `system_cls` through `scenario` on a fresh Redis; its figures and its series."""
    target = Target(None, opts.redis_server)
    run_dir = opts.log_dir / f"{scenario.key}-{system_cls.key}"
    run_dir.mkdir(parents=True, exist_ok=True)
    ctx = RunContext(url=target.url, prefix=f"fleet-{secrets.token_hex(3)}", run_dir=run_dir, sup=sup,
                     env=child_env, python=python, concurrency=opts.workload.concurrency, log=log,
                     reach_env=opts.reach_env if system_cls.tuned else {})
    system = system_cls(ctx)
    run = Run(system, scenario, opts)
    load_before = os.getloadavg()
    try:
        try:
            system.prepare()
            plan, out = run_dir / "plan.json", run_dir / "outcomes.json"
            write_plan(plan, opts.workload)
            run.start_fleet()
            producer = system.start_producer(plan, out, opts.deadline_s)
            producer.wait_line("READY", 60)
            t0 = time.time() * 1000 + LEAD_MS
            producer.send(f"GO {t0:.0f}")
            result_path = Path(run.play(producer, t0))
        finally:
            run.stop()
            sup.forget_dead()
        rows = json.loads(result_path.read_text())["tasks"]
        return figures(system, scenario, opts.timings, run, rows, t0, load_before)  # (reads Redis)
    finally:
        target.close()


def figures(system: System, scenario: Scenario, timings: Timings, run: Run, rows: list[list[Any]],
            t0: float, load_before: tuple[float, float, float]) -> dict[str, Any]:
    if len(rows) != run.opts.workload.n:
        raise ProcessFailed(f"{system.title}: the producer reported {len(rows)} tasks, "
                            f"not {run.opts.workload.n}")
    executions = metrics.read_executions(run.run_dir)
    twice = metrics.twice_ok(executions)
    refused = system.refused({i: rows[i][1] for i in twice}) if twice else {}
    windows = scenario.windows(run.marks, metrics.first_starts(executions), timings)
    summary = metrics.summarise(rows, executions, refused, windows)
    summary["marks_s"] = {k: round((v - t0) / 1000, 2) for k, v in run.marks.items()}
    summary["load_average"] = {"before": [round(x, 2) for x in load_before],
                               "after": [round(x, 2) for x in os.getloadavg()]}
    return {"summary": summary, "series": metrics.series(rows, t0)}
