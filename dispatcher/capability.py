"""One capability's share of the dispatcher: the loop that routes its ready tasks.

Each step routes (a round: read the ready tasks, choose an agent for each, hand them off),
then does the housekeeping that is due (intake, due retries, due deadlines: housekeeping.py),
the lease sweep (leases.py), the check for agents that stopped reading their inbox (stalls.py)
and, once a second, the check for tasks no agent could take (no_agent.py). With nothing moving,
the loop sleeps until a wake-up (new task, freed capacity, registry change), the next due retry
or deadline, or the next lease sweep or stall check; never longer than the idle tick. While the
last round found every agent full, a new task wakes no round (see FULL_RECHECK_S). The parts:

    observations  loads, told speeds, health, probes; the round's candidates
    ready         the ready queue's front
    handoff       dispatch calls, and big rounds' calls in flight
    grants        grants and pulls, the decisions left standing for the scripts
    snapshots     what rounds saw, for `reach explain`
    policy        the capability's policy (pause, rate, max_running are the scripts' to hold)
    stalls        agents that stopped reading: their unread tasks back, nothing new for them
    gone          agents whose process is gone: all their tasks back at once (liveness.py)
"""

from __future__ import annotations

import asyncio
import logging
import random
import time

from broker.infra import fatal, outages
from broker.keys import CapabilityKeys
from broker.protocol.delivery import HOLD_AT_MAX_RUNNING, HOLD_PAUSED, AgentBatch
from broker.protocol.grants import Explanation
from dispatcher.context import DispatcherContext
from dispatcher.grants import Grants
from dispatcher.handoff import PIPELINE_MIN_TASKS, Handoff
from dispatcher.housekeeping import Housekeeping
from dispatcher.leases import LeaseSweep
from dispatcher.liveness import AgentConnections, GoneWatch
from dispatcher.no_agent import NoAgentWatch
from dispatcher.observations import Observations
from dispatcher.policy import CapabilityPolicy
from dispatcher.ready import ReadyQueue
from dispatcher.routing import MAX_ROUND_TASKS, Choice, ReadyTask, RoutingRound, max_unread, round_tasks
from dispatcher.snapshots import Snapshots
from dispatcher.stalls import StallWatch

log = logging.getLogger("reach.dispatcher")

ROUND_GATHER_S = 0.001
"""A round that completions call for waits this long first, so that the completions of a burst
make one round (one round trip) instead of one each; new tasks and registry changes do not."""
FULL_RECHECK_S = 0.05
"""While the last round found every agent full, new tasks wait for room in the queue: room comes
with a completion (which pulls the next task itself, or wakes a round when it could not) or a
registry change (which wakes one), and otherwise a round looks this often."""

Chosen = list[tuple[ReadyTask, Choice]]


class CapabilityLoop:
    def __init__(self, ctx: DispatcherContext, capability: str,
                 connections: AgentConnections | None = None) -> None:
        self.ctx = ctx
        self.capability = capability
        self.keys = CapabilityKeys(ctx.settings.prefix, capability)
        self.observations = Observations(ctx, capability)
        self.ready = ReadyQueue(ctx, self.keys)
        self.handoff = Handoff(ctx, self.keys, self.observations, self.ready)
        self.snapshots = Snapshots(ctx, self.keys)
        self.grants = Grants(ctx, self.keys, self.observations, self.snapshots)
        self.housekeeping = Housekeeping(ctx, self.keys)
        self.leases = LeaseSweep(ctx, self.keys)
        self.no_agent = NoAgentWatch(ctx, self.keys)
        self.stalls = StallWatch(ctx, self.keys, lambda agent_id: self.observations.health.get(agent_id))
        self.gone = GoneWatch(ctx, self.keys, connections or AgentConnections(ctx))
        self.policy = CapabilityPolicy(ctx, capability)
        self._hold_until = 0.0
        """No round before this (monotonic): the rate allows no start until then."""
        self._rng = random.Random()
        self.metrics = ctx.metrics.for_capability(capability) if ctx.metrics is not None else None
        self._wake = asyncio.Event()
        self._urgent = False
        """A wake-up that must not wait (new tasks, registry changes)."""
        self._full = False
        """Whether the last round found agents and no room in any (see FULL_RECHECK_S)."""

    # -- wake-ups ---------------------------------------------------------------------------

    def kick(self, new_tasks: bool = False) -> None:
        if new_tasks:
            self.housekeeping.hurry()
            self.ready.maybe_queued = True
            self.ready.forget()
            if self._full:
                return  # (no agent has room: a round now would only find that again)
        self._urgent = True
        self._wake.set()

    def on_free(self, health_changed: bool = False, finished: int = 1, pulled: int = 0) -> None:
        """An agent finished tasks: route now if tasks may wait in the queue, the grants run
        low or the agent's health moved (its circuit may have opened: its grants must go).
        (Otherwise its room shows in the next grants, which stand meanwhile.) `pulled`: ready
        tasks its completion took in their place: the queue's front is no longer what was
        seen, and an agent that refilled every slot it freed left nothing for a round."""
        if pulled:
            self.ready.forget()
        if health_changed:
            self._urgent = True
        queued = self.ready.maybe_queued and pulled < finished
        if health_changed or queued or self.grants.running_low():
            self._wake.set()

    def on_policy(self) -> None:
        """Its policy changed: read it, and route with it, at once."""
        self.policy.stale()
        self._hold_until = 0.0
        self.kick()

    def on_took(self, taken: int, left: int | None = None) -> None:
        """A submit used grants (see Grants.on_took)."""
        if self.grants.on_took(taken, left):
            self._wake.set()

    # -- the loop ---------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            await self.handoff.close()

    async def _run(self) -> None:
        backoff = 0.1
        while True:
            self._wake.clear()
            try:
                progressed = await self.step()
                backoff = 0.1
            except outages.TRANSIENT_ERRORS as exc:
                log.warning("%s: Redis unavailable (%s); retrying in %.1fs", self.capability, exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            except Exception as exc:
                if fatal.stops(exc):
                    return
                # Never die silently: a dead loop leaves a capability without dispatch.
                log.exception("%s: dispatch step failed; retrying in %.1fs", self.capability, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            if progressed:
                await asyncio.sleep(0)  # let other capabilities and the wake listener run
                continue
            await self._sleep()

    async def _sleep(self) -> None:
        try:
            await asyncio.wait_for(self._wake.wait(), self._idle_timeout())
        except TimeoutError:
            # (a lost wake-up message must not strand a task)
            self.ready.maybe_queued = True
            self.ready.forget()
            return
        if not self._urgent:
            # Woken by a completion: gather the rest of its burst into the same round.
            await asyncio.sleep(ROUND_GATHER_S)
        self._urgent = False

    def _idle_timeout(self) -> float:
        timeout = self.ctx.settings.idle_tick_ms / 1000
        now = self.ctx.view.now_ms()
        house = self.housekeeping
        not_before = house.next_at - time.monotonic()  # (due work waits for it)
        for due in (house.next_delayed_ms, house.next_deadline_ms):
            if due is not None:
                timeout = min(timeout, max((due - now) / 1000, not_before))
        timeout = min(timeout, self.leases.next_at - time.monotonic(),
                      self.stalls.next_at - time.monotonic(), self.gone.next_at - time.monotonic())
        if self._hold_until:
            timeout = min(timeout, max(0.0, self._hold_until - time.monotonic()))
        if self._full and self.ready.maybe_queued:
            timeout = min(timeout, FULL_RECHECK_S)
        return max(0.001, timeout)

    async def step(self) -> bool:
        # Routing first: a task that just arrived is on its way before the housekeeping round
        # trip (what housekeeping makes ready is routed at the next step, which follows at once).
        self.ready.aging_ms = int((await self.policy.refresh())["aging_ms"])
        started = time.perf_counter()
        moved = await self.route()
        if self.metrics is not None:
            self.metrics.round_seconds.observe(time.perf_counter() - started)
        if self.housekeeping.due():
            housekept = await self.housekeeping.run()
            if housekept:
                self.ready.forget()  # tasks came into (or left) the queue
            moved += housekept
        if self.leases.due():
            moved += await self.leases.run()
        if self.stalls.due():
            released = await self.stalls.run()
            if released:
                self.ready.forget()  # (they are queued again)
            moved += released
        if self.gone.due():
            handed_on = await self.gone.run()
            if handed_on:
                self.ready.forget()
            moved += handed_on
        moved += await self.no_agent.run(self.policy.current)
        return moved > 0

    # -- a round ----------------------------------------------------------------------------

    async def route(self) -> int:
        """One routing round; returns how many tasks moved."""
        # While grants stand, hand-offs by grant and their quiet completions change the granted
        # agents' loads without a word: every round reads them first. (Grants stand only while
        # the queue is empty, so a round is rare then. The set standing is its last writer's:
        # the agents another dispatcher granted are read by the registry refresh.)
        await self.observations.refresh_unsure(self.grants.granted_agents())
        self._full = False
        candidates, filtered = self.gone.routable(*self.stalls.routable(*self.observations.candidates()))
        if not candidates or self.policy.current.paused:
            # (Paused: nothing starts, by a round, a grant or a pull.)
            settled, _ = await self.handoff.settle()
            await self.grants.grant(None)
            await self.grants.pull(None)
            return settled
        if time.monotonic() < self._hold_until:  # (the rate allows no start yet)
            settled, _ = await self.handoff.settle()
            return settled
        round_ = RoutingRound(candidates, self.ctx.settings, self.ctx.view.now_ms(), self._rng,
                              self.observations.probes, filtered)
        self._full = round_.capacity <= 0
        want = round_tasks(round_, self.ctx.settings)
        choices, drained, settled = await self._choose(round_, want)
        if self.metrics is not None and choices:
            self.metrics.decisions.inc(len(choices))
        if drained:
            self.ready.maybe_queued = False
        # Pulls stand whether tasks wait or not (a completion pulls only from a queue that has
        # some): the first task that finds no grant is taken by the next completion anywhere,
        # not held until a round notices the queue and writes them.
        await self.grants.pull(round_)
        grant_round = round_ if drained or want <= 0 else None
        if not choices:
            moved, _ = await self.handoff.settle()
            await self.grants.grant(grant_round)
            return settled + moved
        return settled + await self._hand_off(round_, choices, drained, grant_round)

    async def _choose(self, round_: RoutingRound, want: int) -> tuple[Chosen, bool, int]:
        """The round's choices, made as the tasks are read: (choices, whether the queue is
        drained by them, tasks the calls in flight moved meanwhile). Tasks no agent can take
        now (a strict region, a version no live agent has) stay queued and must not hold back
        the tasks behind them while there is room: the round reads on past them, up to
        MAX_ROUND_TASKS entries (a longer such front waits for deadlines or the no-agent
        timeout)."""
        tasks = await self.ready.read(want, skip=self.handoff.inflight_ids) if want > 0 else []
        # The queue is empty once these are routed: the room left is granted, so that the next
        # tasks go to an agent without waiting for a round (see lua/_handoff.lua).
        drained = want > 0 and len(tasks) < want
        choices: Chosen = []
        seen = settled = 0
        while True:
            seen += len(tasks)
            choices += [(task, choice) for task in tasks if (choice := round_.choose(task)) is not None]
            if drained or len(choices) >= want or round_.capacity <= 0 or seen >= MAX_ROUND_TASKS:
                break
            more = min(want, MAX_ROUND_TASKS - seen)
            moved, left = await self.handoff.settle()  # (the offset counts the queue without them)
            settled += moved
            if left:
                # Tasks those calls left are in the queue again, ahead of `seen`: the offset is
                # off by them. The next round reads from the front.
                drained = False
                break
            tasks = await self.ready.read(more, offset=seen)
            drained = len(tasks) < more
        if drained and self.handoff.in_flight:
            # The calls in flight may leave tasks in the queue (an inbox filled up meanwhile):
            # it is empty only if they left none.
            moved, left = await self.handoff.settle()
            settled += moved
            drained = left == 0
        return choices, drained, settled

    async def _hand_off(self, round_: RoutingRound, choices: Chosen, drained: bool,
                        grant_round: RoutingRound | None) -> int:
        """Send the round's choices to the agents' inboxes; returns the tasks that moved."""
        batches = await self._batches(round_, choices)
        handoff = self.handoff
        was_inflight = handoff.in_flight
        settled, _ = await handoff.settle()  # (one round's calls in flight at most: they keep their order)
        rerouted = round_.reroutes > 0
        # (Not after calls in flight that moved nothing: their agents took none, e.g. they had
        # left; the round then waits for its replies, and reports what really moved.)
        policy = self.policy.current
        limited = policy["rate"] > 0 or policy["max_running"] > 0  # (rounds then move few tasks)
        if (not drained and not limited and len(choices) >= PIPELINE_MIN_TASKS
                and (settled or not was_inflight)):
            # Tasks are left and the round was big: while Redis runs these calls, the next
            # round is routed (routing and Redis take turns otherwise, each idle half the time).
            await self.grants.grant(grant_round)  # (tasks are left: no grants)
            handoff.send(batches, rerouted)
            await asyncio.sleep(0)  # (the calls go out now, not once this step is over)
            return settled + len(choices)
        progressed, _ = handoff.note_results(batches, await handoff.dispatch(batches), rerouted)
        await handoff.count()
        self._note_hold(handoff.hold)
        await self.grants.grant(grant_round)  # (the room left; or, with tasks left, no grants)
        return settled + progressed

    def _note_hold(self, hold: int) -> None:
        """The policy let fewer tasks start than chosen: wait for the rate's next start, or for
        the policy to be read again (paused since the last read); at max_running the next
        completion's wake-up brings the next round."""
        if hold == HOLD_PAUSED:
            self.policy.stale()
        elif hold > 0:
            self._hold_until = time.monotonic() + hold / 1000
        elif hold != HOLD_AT_MAX_RUNNING:
            self._hold_until = 0.0

    async def _batches(self, round_: RoutingRound, choices: Chosen) -> list[AgentBatch]:
        """The choices as one batch per agent, each task with the decision its record keeps."""
        round_id = await self.snapshots.of(round_)
        plan: dict[str, list[str | tuple[str, str]]] = {}
        for task, choice in choices:
            why = Explanation(round_id, choice.why, choice.score, choice.eligible).encode()
            plan.setdefault(choice.agent_id, []).append((task.local_id, why))
        by_id = {c.agent_id: c for c in round_.candidates}
        settings = self.ctx.settings
        return [AgentBatch(agent_id, max_unread(by_id[agent_id], settings), items)
                for agent_id, items in plan.items()]
