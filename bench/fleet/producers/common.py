"""What every Python producer shares: arguments, the GO line, pacing and the outcome book."""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.fleet.workload import read_plan


def arguments(extra: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--plan", required=True, help="the workload's plan file (JSON)")
    parser.add_argument("--out", required=True, help="where to write the outcomes (JSON)")
    parser.add_argument("--deadline-s", type=float, default=120.0,
                        help="seconds after the last submit to wait for outcomes")
    for name in extra or []:
        parser.add_argument(f"--{name}")
    return parser.parse_args()


def now_ms() -> float:
    return time.time() * 1000


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def wait_go() -> float:
    """Print READY, then block until the harness's `GO <t0 ms>` line; t0 in epoch ms."""
    say("READY")
    for line in sys.stdin:
        parts = line.split()
        if len(parts) == 2 and parts[0] == "GO":
            return float(parts[1])
    raise SystemExit("stdin closed before GO")


class Book:
    """Submit and outcome times per task; thread-safe; `done` is set once every outcome is in."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.ids: list[str | None] = [None] * n
        self.submitted: list[float | None] = [None] * n
        self.seen: list[float | None] = [None] * n
        self.outcome: list[str | None] = [None] * n
        self._left = n
        self._lock = threading.Lock()
        self.done = threading.Event()

    def submit(self, i: int, task_id: str, at: float) -> None:
        self.ids[i] = task_id
        self.submitted[i] = at

    def see(self, i: int, ok: bool, at: float | None = None) -> None:
        with self._lock:
            if self.outcome[i] is not None or not 0 <= i < self.n:
                return  # (a second notice of the same outcome)
            self.seen[i] = now_ms() if at is None else at
            self.outcome[i] = "ok" if ok else "failed"
            self._left -= 1
            if self._left == 0:
                self.done.set()

    def write(self, path: str | Path, extra: dict[str, Any] | None = None) -> None:
        rows = [[i, self.ids[i], self.submitted[i], self.seen[i], self.outcome[i]] for i in range(self.n)]
        Path(path).write_text(json.dumps({"tasks": rows, **(extra or {})}))
        say(f"RESULT {path}")


def plan(args: argparse.Namespace) -> tuple[float, list[float]]:
    return read_plan(args.plan)


def pace(t0: float, i: int, rate: float) -> None:
    """Sleep until task i is due (never sleeps when behind: open loop catches up)."""
    delay = (t0 + i * 1000 / rate - now_ms()) / 1000
    if delay > 0:
        time.sleep(delay)
