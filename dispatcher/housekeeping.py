"""A capability's housekeeping: raw intake entries become tasks, retries whose backoff ended go
back to the ready queue, tasks past their deadline fail. Each kind of
work is found in one round trip and done in one script call.

While tasks flow this runs at most every HOUSEKEEPING_S (a retry or deadline is late by that
much at worst), so that routing rounds, which follow every completion, do not each pay for it.
"""

from __future__ import annotations

import time

from broker.keys import CapabilityKeys
from broker.protocol.lifecycle import expire_call, parse_expire, promote_call
from dispatcher.context import DispatcherContext
from dispatcher.intake import IntakeReader

SWEEP_BATCH = 200
HOUSEKEEPING_S = 0.05


class Housekeeping:
    def __init__(self, ctx: DispatcherContext, keys: CapabilityKeys) -> None:
        self.ctx = ctx
        self.keys = keys
        self.capability = keys.capability
        self.intake = IntakeReader(ctx, keys.capability)
        self.next_at = 0.0
        """When it is due next (monotonic; 0: now)."""
        self.next_delayed_ms: float | None = None
        self.next_deadline_ms: float | None = None
        """The next retry and deadline due (server clock), for the loop's sleep."""
        self.expired = 0

    def due(self) -> bool:
        return time.monotonic() >= self.next_at

    def hurry(self) -> None:
        """A new task may carry an earlier deadline: look as soon as a run is allowed (within
        HOUSEKEEPING_S, as for every deadline; not at once for each submit, which at a steady
        flow of queued tasks made a round trip per task)."""
        self.next_deadline_ms = 0.0  # (not known: taken as due, so the loop wakes for it)

    async def run(self) -> int:
        """Do what is due; returns how many tasks it moved."""
        self.next_at = time.monotonic() + HOUSEKEEPING_S
        now = self.ctx.view.now_ms()
        keys = self.keys
        pipe = self.ctx.redis.pipeline(transaction=False)
        pipe.xlen(keys.intake)
        pipe.zrangebyscore(keys.delayed, "-inf", now, start=0, num=SWEEP_BATCH)
        pipe.zrange(keys.delayed, 0, 0, withscores=True)
        pipe.zrangebyscore(keys.deadlines, "-inf", now, start=0, num=SWEEP_BATCH)
        pipe.zrange(keys.deadlines, 0, 0, withscores=True)
        intake_len, due_retries, delayed_head, due_deadlines, deadline_head = await pipe.execute()
        moved = 0
        if intake_len:
            moved += await self.intake.take()
        if due_retries:
            promote = promote_call(self.ctx.settings, self.capability, due_retries)
            moved += int(await self.ctx.scripts(promote))
        if due_deadlines:
            reply = parse_expire(await self.ctx.scripts(
                expire_call(self.ctx.settings, self.capability, due_deadlines)))
            self.expired += reply.expired
            moved += reply.expired + (1 if len(due_deadlines) == SWEEP_BATCH else 0)
        if due_retries or due_deadlines:
            delayed_head = await self.ctx.redis.zrange(keys.delayed, 0, 0, withscores=True)
            deadline_head = await self.ctx.redis.zrange(keys.deadlines, 0, 0, withscores=True)
        self.next_delayed_ms = float(delayed_head[0][1]) if delayed_head else None
        self.next_deadline_ms = float(deadline_head[0][1]) if deadline_head else None
        return moved
