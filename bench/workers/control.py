"""The launchers' side of the line protocol (see bench/procs.py).

`READY` is printed once the launcher is connected; a reader thread turns the harness's `GO`,
`REPORT` and `STOP` lines into events. `Span` keeps the first and last result-stored times of the
tasks finished since the last `REPORT`.
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any


class Span:
    """First/last result-stored time (ms) and count since the last report; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.first_ms: float | None = None
        self.last_ms: float | None = None
        self.n = 0

    def mark(self, at_ms: float, count: int = 1) -> None:
        with self._lock:
            if self.first_ms is None or at_ms < self.first_ms:
                self.first_ms = at_ms
            if self.last_ms is None or at_ms > self.last_ms:
                self.last_ms = at_ms
            self.n += count

    def take(self) -> dict[str, Any]:
        with self._lock:
            out = {"first_ms": self.first_ms, "last_ms": self.last_ms, "n": self.n}
            self.first_ms = self.last_ms = None
            self.n = 0
        return out


class Control:
    def __init__(self, span: Span) -> None:
        self.span = span
        self.go = threading.Event()
        self.stop = threading.Event()
        threading.Thread(target=self._read, name="control", daemon=True).start()

    @staticmethod
    def say(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    def ready(self) -> None:
        self.say("READY")

    def _read(self) -> None:
        for line in sys.stdin:
            command = line.strip()
            if command == "GO":
                self.go.set()
            elif command == "REPORT":
                self.say("STATS " + json.dumps(self.span.take()))
            elif command == "STOP":
                break
        self.stop.set()  # STOP, or the harness went away (stdin closed)
        self.go.set()
