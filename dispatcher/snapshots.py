"""What routing rounds saw, kept for `reach explain`: a task's record names the snapshot of the
round that placed it (its `explain` field, see broker/protocol/grants.py)."""

from __future__ import annotations

import time

from broker import codec
from broker.keys import CapabilityKeys
from dispatcher.context import DispatcherContext
from dispatcher.routing import RoutingRound

EXPLAIN_TTL_MS = 15 * 60 * 1000


class Snapshots:
    def __init__(self, ctx: DispatcherContext, keys: CapabilityKeys) -> None:
        self.ctx = ctx
        self.keys = keys
        self._id = ""
        self._at = 0.0
        self._seen: frozenset[str] = frozenset()
        self._seq = 0
        """Snapshot ids are the dispatcher's tag and a count: short, as every task's record
        names its round."""

    async def of(self, round_: RoutingRound) -> str:
        """The id of a snapshot of what the round saw: stored at most once a second while the
        same agents serve the capability (and at once when they change)."""
        now = time.monotonic()
        seen = frozenset([*(c.agent_id for c in round_.agents), *round_.filtered])
        if self._id and now - self._at < 1.0 and seen == self._seen:
            return self._id
        self._seq += 1
        self._id = f"{self.ctx.tag}.{self._seq:x}"
        self._at = now
        self._seen = seen
        snapshot = {"dispatcher": self.ctx.dispatcher_id, **round_.snapshot()}
        await self.ctx.redis.set(self.keys.explain(self._id), codec.dumps(snapshot), px=EXPLAIN_TTL_MS)
        return self._id
