"""The agent side of every Python system: how long a task takes here, and the execution log.

An agent process learns who it is and how to misbehave from its environment:

    FLEET_AGENT    its name (a1..a8)
    FLEET_LOG      the file it appends one line per execution start and end to
    FLEET_CONTROL  a JSON file: {"fail", "slow_from_ms", "slow_factor", "cold_ms", "cold_factor"},
                   read again whenever the harness rewrites it (a stat per task)

Log lines (wall-clock ms; os.write on an O_APPEND descriptor, so lines from threads never mix
and a SIGKILL loses nothing written): `S <task> <agent> <start>` when an execution starts,
`E <task> <agent> <start> <end> ok|fail` when it ends. bench/bullmq/fleet_worker.js writes the
same lines.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any


class AgentFailure(Exception):
    """The black hole's error: retryable in every system (an expired upstream key, say)."""


class Behaviour:
    def __init__(self) -> None:
        self.agent = os.environ.get("FLEET_AGENT", "agent")
        self._log = os.open(os.environ.get("FLEET_LOG", os.devnull),
                            os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._control_path = os.environ.get("FLEET_CONTROL", "")
        self._control: dict[str, Any] = {}
        self._mtime = -1
        self._first_start: float | None = None
        self._lock = threading.Lock()

    def control(self) -> dict[str, Any]:
        if not self._control_path:
            return {}
        try:
            mtime = os.stat(self._control_path).st_mtime_ns
        except OSError:
            return self._control
        if mtime != self._mtime:
            try:
                with open(self._control_path) as f:
                    self._control = json.load(f)
                self._mtime = mtime
            except (OSError, ValueError):
                pass  # (the harness is renaming a new one in: read it next time)
        return self._control

    def start(self, task: int) -> float:
        now = time.time() * 1000
        with self._lock:
            if self._first_start is None:
                self._first_start = now
        os.write(self._log, f"S {task} {self.agent} {now:.1f}\n".encode())
        return now

    def end(self, task: int, started: float, ok: bool) -> None:
        now = time.time() * 1000
        outcome = "ok" if ok else "fail"
        os.write(self._log, f"E {task} {self.agent} {started:.1f} {now:.1f} {outcome}\n".encode())

    def fails(self) -> bool:
        return bool(self.control().get("fail"))

    def seconds(self, duration_ms: float, started: float) -> float:
        """How long this task sleeps here: its duration times the agent's current factor."""
        control = self.control()
        factor = 1.0
        slow_from = control.get("slow_from_ms")
        if slow_from is not None and started >= slow_from:
            factor = float(control.get("slow_factor", 1.0))
        cold_ms = float(control.get("cold_ms") or 0)
        if cold_ms and self._first_start is not None and started < self._first_start + cold_ms:
            factor = max(factor, float(control.get("cold_factor", 1.0)))
        return duration_ms * factor / 1000


_behaviour: Behaviour | None = None


def behaviour() -> Behaviour:
    """This process's one Behaviour (made on first use, after the environment is set)."""
    global _behaviour
    if _behaviour is None:
        _behaviour = Behaviour()
    return _behaviour


def run_sync(task: int, duration_ms: float) -> dict[str, int]:
    """The task body for thread-based agents (Celery, dramatiq)."""
    b = behaviour()
    started = b.start(task)
    if b.fails():
        b.end(task, started, False)
        raise AgentFailure("upstream key expired")
    try:
        time.sleep(b.seconds(duration_ms, started))
    except BaseException:
        b.end(task, started, False)
        raise
    b.end(task, started, True)
    return {"i": task}
