"""Firing the fleet's periodic schedules (broker/schedule.py): every dispatcher looks at them
at each schedule's due time (and at least once a second), submits the task of the latest due
time not fired yet, and records the fire. The idempotency key of a due time makes its task
once however many dispatchers look."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from broker.errors import QueueFull
from broker.infra import fatal
from broker.keys import RegistryKeys
from broker.protocol.policy import schedule_fired_call
from broker.protocol.submit import SubmitOptions, build_submit_request, parse_submit, submit_call
from broker.schedule import Schedule
from dispatcher.context import DispatcherContext

log = logging.getLogger("reach.dispatcher")

LOOK_AT_LEAST_S = 1.0
LOOK_AT_MOST_S = 0.05


class Scheduler:
    def __init__(self, ctx: DispatcherContext) -> None:
        self.ctx = ctx
        self.fired = 0

    async def run(self) -> None:
        while True:
            pause = LOOK_AT_LEAST_S
            try:
                pause = await self.look()
            except Exception as exc:  # (the schedules must never stop the dispatcher)
                if fatal.stops(exc):
                    return
                log.warning("schedules not looked at this time (%s)", exc)
            await asyncio.sleep(pause)

    async def look(self) -> float:
        """Fire what is due; returns how long until the next due time (within bounds)."""
        rk = RegistryKeys(self.ctx.settings.prefix)
        stored: Any = await self.ctx.redis.hgetall(rk.schedules)
        if not stored:
            return LOOK_AT_LEAST_S
        fires: Any = await self.ctx.redis.hgetall(rk.schedule_fires)
        now = self.ctx.view.now_ms()
        soonest = now + LOOK_AT_LEAST_S * 1000
        for name, text in stored.items():
            schedule = Schedule.parse(text)
            if schedule is None or schedule.paused or not self.ctx.serves(schedule.capability):
                continue
            last = int(fires.get(name) or 0)
            due = schedule.latest_due(last, now)
            if due is not None:
                await self._fire(schedule, due)
                last = due
            soonest = min(soonest, schedule.next_due(max(last, now)))
        return min(LOOK_AT_LEAST_S, max(LOOK_AT_MOST_S, (soonest - now) / 1000 + 0.005))

    async def _fire(self, schedule: Schedule, due: int) -> None:
        settings = self.ctx.settings
        options = SubmitOptions(priority=schedule.priority, idempotency_key=f"schedule:{schedule.name}:{due}",
                                metadata={"schedule": schedule.name, "due_at": due})
        request = build_submit_request(settings, schedule.capability, schedule.payload, options)
        try:
            rows = parse_submit(schedule.capability, settings.max_queue_depth,
                                await self.ctx.scripts(submit_call(settings, [request])))
        except QueueFull as exc:
            log.warning("schedule %s: %s; its task for %d waits for the next look", schedule.name, exc, due)
            return
        if await self.ctx.scripts(schedule_fired_call(settings, schedule.name, due)) and rows[0][1]:
            self.fired += 1
            log.info("schedule %s: task %s for its due time %d", schedule.name, rows[0][0], due)
