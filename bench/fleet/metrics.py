"""The figures of one system in one scenario, from the producer's outcomes and the agents' logs.

- completed / failed: outcomes the producer saw (failed = the system gave up: a dead letter);
  unfinished: submitted, no outcome seen before the deadline.
- latency: submit -> outcome seen by the producer, over every submitted task; an unfinished task
  counts as infinitely late, so a system cannot look fast by losing tasks.
- attempts: executions that started, per task (a SIGKILLed execution is one of them).
- ran twice to effect: tasks two or more of whose executions returned success and had that
  success accepted (a late result the system refused, fenced, is no effect).
- touched the bad agent: tasks one of whose executions overlapped a bad window (scenarios.py).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Execution:
    task: int
    agent: str
    start: float
    end: float | None = None
    ok: bool | None = None


def read_executions(run_dir: Path) -> list[Execution]:
    """Every execution in the agents' logs (an `S` line, and its `E` line when it ended)."""
    runs: dict[tuple[int, str, str], Execution] = {}
    for path in sorted(run_dir.glob("exec-*.log")):
        for line in path.read_text(errors="replace").splitlines():
            parts = line.split()
            if len(parts) >= 4 and parts[0] == "S":
                key = (int(parts[1]), parts[2], parts[3])
                runs.setdefault(key, Execution(int(parts[1]), parts[2], float(parts[3])))
            elif len(parts) == 6 and parts[0] == "E":
                key = (int(parts[1]), parts[2], parts[3])
                run = runs.setdefault(key, Execution(int(parts[1]), parts[2], float(parts[3])))
                run.end, run.ok = float(parts[4]), parts[5] == "ok"
    return list(runs.values())


def twice_ok(executions: list[Execution]) -> dict[int, int]:
    """Tasks with two or more successful executions: task -> how many."""
    counts = Counter(e.task for e in executions if e.ok)
    return {task: k for task, k in counts.items() if k >= 2}


def touched(executions: list[Execution], windows: list[tuple[str, float, float]]) -> set[int]:
    out = set()
    for e in executions:
        end = e.end if e.end is not None else math.inf
        for agent, start, stop in windows:
            if e.agent == agent and e.start <= stop and end >= start:
                out.add(e.task)
    return out


def first_starts(executions: list[Execution]) -> dict[str, float]:
    out: dict[str, float] = {}
    for e in executions:
        out[e.agent] = min(out.get(e.agent, math.inf), e.start)
    return out


def latencies(rows: list[list[Any]]) -> list[float]:
    """submit -> seen in ms per task; math.inf for a task never seen (or never submitted)."""
    out = []
    for _, _, submitted, seen, _ in rows:
        out.append(seen - submitted if seen is not None and submitted is not None else math.inf)
    return out


def summarise(rows: list[list[Any]], executions: list[Execution], refused: dict[int, int],
              windows: list[tuple[str, float, float]]) -> dict[str, Any]:
    n = len(rows)
    lat = latencies(rows)
    outcomes = Counter(row[4] for row in rows)
    per_task = Counter(e.task for e in executions)
    attempts = Counter(per_task.get(i, 0) for i in range(n))
    dup = {t: k - refused.get(t, 0) for t, k in twice_ok(executions).items()}
    bad = touched(executions, windows)
    return {
        "n": n,
        "completed": outcomes.get("ok", 0),
        "failed": outcomes.get("failed", 0),
        "unfinished": n - outcomes.get("ok", 0) - outcomes.get("failed", 0),
        "twice_to_effect": sum(1 for k in dup.values() if k >= 2),
        "refused_late_results": sum(refused.values()),
        "p50_ms": _ms(percentile(lat, 50)), "p95_ms": _ms(percentile(lat, 95)),
        "p99_ms": _ms(percentile(lat, 99)), "max_ms": _ms(max(lat) if lat else math.nan),
        "attempts_mean": round(sum(per_task.values()) / n, 3) if n else None,
        "attempts": {str(k): v for k, v in sorted(attempts.items())},
        "touched_bad": len(bad),
        "touched_bad_pct": round(100 * len(bad) / n, 2) if n else None,
        "executions_on": dict(sorted(Counter(e.agent for e in executions).items())),
    }


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile with linear interpolation; infinities (unfinished tasks) allowed."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    if pos == low or ordered[low] == ordered[high]:
        return ordered[low]
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def _ms(value: float) -> float | None:
    """Rounded ms; None stands for infinity (JSON has none): later than the run's deadline."""
    if math.isinf(value) or math.isnan(value):
        return None
    return round(value, 1)


def series(rows: list[list[Any]], t0: float) -> list[list[float | None]]:
    """[submit s after t0, latency ms or None] per task, for the plot."""
    return [[round((row[2] - t0) / 1000, 4) if row[2] is not None else None,
             round(row[3] - row[2], 1) if row[3] is not None and row[2] is not None else None]
            for row in rows]
