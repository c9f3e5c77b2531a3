"""Choosing an agent for each ready task: filter, score, weighted random choice (pure logic).

    model   candidates, ready tasks, choices
    rules   one agent's filters, room and score
    pool    weighted random sampling
    round   one routing round (and its grants and pulls), and how many tasks it reads
"""

from dispatcher.routing.model import Candidate, Choice, InboxLoad, ReadyTask
from dispatcher.routing.pool import WeightedPool
from dispatcher.routing.round import FULL_REASONS, MAX_ROUND_TASKS, RoutingRound, assign, round_tasks
from dispatcher.routing.rules import (
    RECHECK_MS,
    REFILL_WINDOW_MS,
    at_watermark,
    components,
    fleet_speed,
    gate,
    judged_speed,
    max_unread,
    prefetch,
    refill_allowance,
    room,
    score,
    slower_than_fleet,
    speed,
    task_ms,
    told_speed,
)

__all__ = ["FULL_REASONS", "MAX_ROUND_TASKS", "RECHECK_MS", "REFILL_WINDOW_MS", "Candidate", "Choice",
           "InboxLoad", "ReadyTask", "RoutingRound", "WeightedPool", "assign", "at_watermark", "components",
           "fleet_speed", "gate", "judged_speed", "max_unread", "prefetch", "refill_allowance", "room",
           "round_tasks", "score", "slower_than_fleet", "speed", "task_ms", "told_speed"]
