"""Handing a round's choices to the agents' inboxes: the dispatch calls, and a big round's calls
left in flight while the next round is routed.

Each dispatch call is atomic on its own and short (at most DISPATCH_CALL_TASKS tasks, several
agents each), so Redis never stalls on one; a round's calls go in one round trip. A round that
hands off at least PIPELINE_MIN_TASKS tasks and leaves ready tasks behind does not wait for
its calls (`send`): while Redis runs them, the next round is routed, counting these tasks in
their agents' loads (RoutingRound counts each choice in the load it was made from) and passing
over them in the queue; their replies, read before its own calls go out (`settle`), give the
exact loads. dispatch.lua checks every hand-off itself, so a round routed on that view can only
find a task taken or an inbox full, never deliver a task twice.
"""

from __future__ import annotations

import asyncio
import logging

from broker.keys import STAT_REROUTES, CapabilityKeys
from broker.protocol.delivery import AgentBatch, DispatchResult, dispatch_call, parse_dispatch
from dispatcher.context import DispatcherContext
from dispatcher.observations import Observations
from dispatcher.ready import ReadyQueue

log = logging.getLogger("reach.dispatcher")

DISPATCH_CALL_TASKS = 128
"""Most tasks one dispatch call hands off (a script blocks Redis while it runs)."""
PIPELINE_MIN_TASKS = 512
PEEK_MIN = 16
"""A round's last dispatch call returns at least this many of the ready tasks it leaves."""


class Handoff:
    def __init__(self, ctx: DispatcherContext, keys: CapabilityKeys, observations: Observations,
                 ready: ReadyQueue) -> None:
        self.ctx = ctx
        self.keys = keys
        self.capability = keys.capability
        self.observations = observations
        self.ready = ready
        self._inflight: asyncio.Task[list[DispatchResult]] | None = None
        self._inflight_batches: list[AgentBatch] = []
        self._inflight_rerouted = False
        self.inflight_ids: frozenset[str] = frozenset()
        """The tasks the calls in flight hand off: still in the queue until Redis runs them."""
        self.pipelined_rounds = 0
        self.hold = 0
        """The policy's hold in the last dispatch call's reply (see DispatchReply.hold)."""
        self.dispatched = 0
        self.reroutes = 0
        """Reroutes not yet added to the capability's stats (see count)."""
        self.total_reroutes = 0

    @property
    def in_flight(self) -> bool:
        return self._inflight is not None

    async def dispatch(self, batches: list[AgentBatch], last: bool = True) -> list[DispatchResult]:
        """Run a round's hand-offs in one round trip. `last`: the final call also returns the
        front of the queue it leaves, for the next round (not for calls in flight while the
        next round is routed: that round reads the queue)."""
        if not batches:
            return []
        groups = _groups(batches)
        peek = 0
        if last:
            tasks = sum(len(b.tasks) for b in batches)
            peek = min(self.ctx.settings.dispatch_batch, max(PEEK_MIN, 2 * tasks))
        calls = [dispatch_call(self.ctx.settings, self.capability, g, peek if i == len(groups) - 1 else 0)
                 for i, g in enumerate(groups)]
        gen = self.ready.gen
        out: list[DispatchResult] = []
        peeked: list[tuple[str, float]] = []
        self.hold = 0
        for group, reply in zip(groups, await self.ctx.scripts.run_all(calls), strict=True):
            parsed = parse_dispatch(reply, len(group))
            out += parsed.results
            peeked = parsed.peeked
            self.hold = parsed.hold or self.hold
        self.ready.install(gen, peeked, peek)
        return out

    def note_results(self, batches: list[AgentBatch], results: list[DispatchResult],
                     rerouted: bool) -> tuple[int, int]:
        """Take in what dispatch calls did: the agents' exact loads, the counts. Returns the
        tasks that moved (dispatched, expired, or found taken already) and those left in the
        queue (their agent's inbox was full)."""
        progressed = dispatched = left = 0
        for batch, result in zip(batches, results, strict=True):
            self.observations.note_load(batch.agent_id, result.inbox_len, result.inbox_pending)
            dispatched += result.dispatched
            progressed += result.dispatched + result.expired + result.taken
            left += result.left
        self.reroutes += left  # the inbox filled up meanwhile: they go elsewhere
        self.dispatched += dispatched
        if dispatched and rerouted:
            self.reroutes += dispatched  # routed past agents whose inbox was full
        return progressed, left

    def send(self, batches: list[AgentBatch], rerouted: bool) -> None:
        """Start a round's dispatch calls without waiting for them (see the module's docstring).
        A load told meanwhile (a `free` or `took` wake-up) may have been read before these
        calls ran: an agent can then be sent more than it has room for, which dispatch.lua
        leaves queued for another round."""
        self._inflight = asyncio.ensure_future(self.dispatch(batches, last=False))
        self._inflight_batches = batches
        self._inflight_rerouted = rerouted
        self.inflight_ids = frozenset(local for batch in batches for local in batch.local_ids())
        self.pipelined_rounds += 1
        log.debug("%s: %d tasks in flight while the next round is routed", self.capability,
                  len(self.inflight_ids))

    async def settle(self) -> tuple[int, int]:
        """Read the replies of the dispatch calls in flight, if any, and take them in. Returns
        the tasks they moved and those they left queued. (An error of theirs is raised here:
        the step fails and is retried.)"""
        inflight = self._inflight
        if inflight is None:
            return 0, 0
        batches, rerouted = self._inflight_batches, self._inflight_rerouted
        self._inflight, self._inflight_batches, self.inflight_ids = None, [], frozenset()
        try:
            results = await inflight
        except BaseException:
            # Whether they ran is not known: the next round reads these agents' loads first.
            self.observations.unsure.update(batch.agent_id for batch in batches)
            raise
        out = self.note_results(batches, results, rerouted)
        await self.count()
        return out

    async def count(self) -> None:
        """Add the reroutes seen to the capability's stats (dispatch.lua counts dispatches)."""
        if not self.reroutes:
            return
        await self.ctx.redis.hincrby(self.keys.stats, STAT_REROUTES, self.reroutes)
        self.total_reroutes += self.reroutes
        self.reroutes = 0

    async def close(self) -> None:
        """Stop reading the replies of calls in flight (Redis runs calls it has whole or not
        at all, replies read or not)."""
        inflight = self._inflight
        if inflight is not None:
            inflight.cancel()
            await asyncio.gather(inflight, return_exceptions=True)


def _groups(batches: list[AgentBatch]) -> list[list[AgentBatch]]:
    """The batches in dispatch calls of at most DISPATCH_CALL_TASKS tasks (a batch is never split)."""
    groups: list[list[AgentBatch]] = []
    group: list[AgentBatch] = []
    size = 0
    for batch in batches:
        if group and size + len(batch.tasks) > DISPATCH_CALL_TASKS:
            groups.append(group)
            group, size = [], 0
        group.append(batch)
        size += len(batch.tasks)
    if group:
        groups.append(group)
    return groups
