"""The ready queue's score: priority with aging, and what a dispatcher reads of a plain task.

    score = ready_at_ms - priority * aging_ms + (priority + 1) / 16 (+ 1/32 with constraints)

Higher priority runs first, and a task that waits gains a level per aging_ms without being
rescored. The fraction carries the task's priority and whether it has routing constraints (a
session, a region, a version, an agent to avoid), so that ZRANGE WITHSCORES is all a dispatcher
reads of a plain task. The scripts encode it (queue_score in broker/lua/_queue.lua, the twin of
`encode` here; a test holds the two to the same numbers) and the dispatcher decodes it.
"""

from __future__ import annotations

import math


def encode(ready_at_ms: int, priority: int, aging_ms: int, constrained: bool) -> float:
    fraction = (priority + 1) / 16 + (1 / 32 if constrained else 0.0)
    return float(f"{ready_at_ms - priority * aging_ms + fraction:.5f}")


def decode(score: float) -> tuple[int, bool]:
    """(priority, has routing constraints) of a ready task, from its score's fraction."""
    steps = round((score - math.floor(score)) * 32)
    return max(0, min(9, steps // 2 - 1)), bool(steps % 2)


def ready_at(score: float, priority: int, aging_ms: int) -> int:
    """When the task became ready (server clock ms), from its score and its priority."""
    return math.floor(score) + priority * aging_ms
