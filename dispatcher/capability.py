"""One capability's share of the dispatcher.

Each step looks at everything that may need doing in one round trip (due retries, due
deadlines, raw intake) and then does it; routing always runs. With nothing moving, the loop
sleeps until a wake-up (new task, freed capacity, registry change), the next due retry or
deadline, or the next lease sweep — never longer than the idle tick.

    intake     raw producers' entries -> tasks (or the DLQ as malformed)
    promote    retries whose backoff ended -> ready queue
    expire     tasks past their deadline (anywhere) or never started in time -> failed
    reclaim    inbox entries whose lease lapsed -> requeued as a new attempt
    route      ready tasks -> agents' inboxes
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from typing import TYPE_CHECKING, Any

from broker import codec, connection, inbox, protocol
from broker.keys import CapabilityKeys
from dispatcher import routing
from dispatcher.intake import IntakeReader

if TYPE_CHECKING:
    from dispatcher.service import Dispatcher

log = logging.getLogger("reach.dispatcher")

SWEEP_BATCH = 200
ROUTING_FIELDS = ("session_id", "region", "routing", "last_agent_id")
EXPLAIN_TTL_MS = 15 * 60 * 1000
HOUSEKEEPING_S = 0.05
DISPATCH_CALL_TASKS = 128
"""Most tasks one dispatch call hands off (a script blocks Redis while it runs)."""
ROUND_TASKS_PER_AGENT = 4
MAX_ROUND_TASKS = 4096
"""A round with many agents takes up to ROUND_TASKS_PER_AGENT ready tasks per eligible agent
(at most MAX_ROUND_TASKS), not just dispatch_batch."""
PIPELINE_MIN_TASKS = 512
"""A round that hands off at least this many tasks and leaves ready tasks behind does not wait
for its dispatch calls: the next round is routed while Redis runs them (see _route)."""
ROUND_GATHER_S = 0.001
"""A round that completions call for waits this long first, so that the completions of a burst
make one round (one round trip) instead of one each; new tasks and registry changes do not."""
PEEK_MIN = 16
"""A dispatch call returns at least this many of the ready tasks it leaves (see _dispatch)."""
GRANT_TTL_TICKS = 3
"""Grants stand this many idle ticks unless a dispatcher refreshes them (it does every tick)."""


class CapabilityLoop:
    def __init__(self, dispatcher: Dispatcher, capability: str) -> None:
        self.d = dispatcher
        self.capability = capability
        self.keys = CapabilityKeys(dispatcher.settings.prefix, capability)
        self.loads: dict[str, routing.InboxLoad] = {}
        self.speed: dict[str, tuple[float, float]] = {}
        """Per agent: mean execution ms of its latest completions the wake-ups told, and when
        (monotonic): see note_speed."""
        self._wake = asyncio.Event()
        self._next_delayed_ms: float | None = None
        self._next_deadline_ms: float | None = None
        self._next_sweep = 0.0
        self._next_housekeeping = 0.0
        self.intake = IntakeReader(dispatcher, capability)
        self.health: dict[str, routing.AgentHealth] = {}
        self.probes: dict[str, int] = {}
        self._rng = random.Random()
        self._snapshot_id = ""
        self._snapshot_at = 0.0
        self._snapshot_seen: frozenset[str] = frozenset()
        self._snapshot_seq = 0
        """Snapshot ids are the dispatcher's tag and a count: short, as every task's record
        names its round."""
        self._maybe_queued = True
        """Tasks may wait in the ready queue (cleared by a round that drains it)."""
        self._urgent = False
        """A wake-up that must not wait (new tasks, registry changes)."""
        self._head: list[tuple[str, float]] | None = None
        """The front of the ready queue (local id, score) as the last dispatch call left it, so
        the next round needs no read of its own; dropped whenever the queue may have changed
        otherwise (new, promoted, requeued tasks all come with a wake-up). `_head_whole`: it
        is the whole queue."""
        self._head_whole = False
        self._head_gen = 0
        """Moves whenever the head is forgotten: a peek taken before that is not installed."""
        self._grants_written = 0
        self._grants_left = 0
        """Grants this dispatcher wrote last, and how many of them submits have not used."""
        self._granted: list[tuple[str, bool]] = []
        """The grants standing (agent, low-priority only; sorted), as this dispatcher last
        wrote them."""
        self._granted_until = 0.0
        self._probe_grants: dict[str, int] = {}
        """Agents whose probe this dispatcher granted and, as far as it knows, no submit has
        taken yet, with the probe's time in `probes` (see grant.lua)."""
        self._unsure: set[str] = set()
        """Agents whose inbox loads the next round reads first: those granted (submits hand
        them tasks, and their completions end tasks, without telling while the grants stand:
        see submit.lua and complete.lua), and those of dispatch calls that failed."""
        self._pulls: list[tuple[str, int, bool]] = []
        """The standing pulls (agent, most unread, cold) as this dispatcher last wrote them."""
        self._pulls_until = 0.0
        self._inflight: asyncio.Task[list[protocol.DispatchResult]] | None = None
        """The dispatch calls of the last round, sent and not yet answered (see _route)."""
        self._inflight_batches: list[protocol.AgentBatch] = []
        self._inflight_ids: frozenset[str] = frozenset()
        """The tasks those calls hand off: still in the queue until Redis runs them, so a read
        of the queue meanwhile passes over them."""
        self._inflight_rerouted = False
        self.pipelined_rounds = 0
        self.dispatched = 0
        self.reroutes = 0
        self.total_reroutes = 0
        self.reclaimed = 0
        self.expired = 0

    def kick(self, new_tasks: bool = False) -> None:
        self._urgent = True
        if new_tasks:
            self._next_deadline_ms = None  # a new task may carry an earlier deadline
            self._next_housekeeping = 0.0
            self._maybe_queued = True
            self._forget_head()  # the queue's front may have changed
        self._wake.set()

    def _forget_head(self) -> None:
        self._head = None
        self._head_gen += 1

    def on_free(self, health_changed: bool = False, finished: int = 1, pulled: int = 0) -> None:
        """An agent finished tasks: route now if tasks may wait in the queue, the grants run
        low or the agent's health moved (its circuit may have opened: its grants must go).
        (Otherwise its room shows in the next grants, which stand meanwhile: no round per
        completion while tasks go straight to agents.) `pulled`: ready tasks its completion
        took in their place (a standing pull): the queue's front is no longer what was seen,
        and an agent that refilled every slot it freed left nothing for a round to do."""
        if pulled:
            self._forget_head()
        if health_changed:
            self._urgent = True
        queued = self._maybe_queued and pulled < finished
        if health_changed or queued or self._grants_running_low():
            self._wake.set()

    def on_took(self, taken: int, left: int | None = None) -> None:
        """A submit used grants: route (and grant again) once half of them are gone. `left`:
        the grants standing after it (submits tell when that falls to a power of two or to
        none, see submit.lua; a producer of the release before tells every hand-off, without)."""
        self._grants_left = left if left is not None else self._grants_left - taken
        # (grants all used that this dispatcher did not write: their writer may be gone)
        if self._grants_running_low() or (left == 0 and not self._grants_written):
            self._wake.set()

    def _grants_running_low(self) -> bool:
        """Submits used half of the grants this dispatcher wrote last: time to write them again."""
        return self._grants_left * 2 < self._grants_written

    def note_load(self, agent_id: str, outstanding: int, running: int) -> None:
        """An agent's exact inbox load: entries not finished, and those it has read (running);
        running -1: not known (the dispatch call did not need to look), so at most what it was."""
        if running < 0:
            before = self.loads.get(agent_id)
            running = min(before.running if before else 0, outstanding)
        self.loads[agent_id] = routing.InboxLoad(outstanding, running)

    def note_speed(self, agent_id: str, finished: int, exec_ms: float, now: float | None = None) -> None:
        """Mean execution time of an agent's latest completions (a moving average), so the
        refill allowance follows its speed now rather than at its last heartbeat. `now`:
        monotonic seconds (default: the clock's)."""
        if finished <= 0 or not math.isfinite(exec_ms) or exec_ms < 0:
            return  # (a malformed wake-up: "nan" parses as a float and would stick in the mean)
        now = time.monotonic() if now is None else now
        mean = exec_ms / finished
        # (A speed no longer counted, see recent_speed, is no part of the new one either: an
        # agent quiet for minutes whose tasks turned slow is slow now, not a fifth of it.)
        before = self.recent_speed(agent_id, now)
        self.speed[agent_id] = (mean if before is None else 0.8 * before + 0.2 * mean, now)

    def recent_speed(self, agent_id: str, now: float) -> float | None:
        """The agent's speed from note_speed while the wake-ups keep telling it; None once
        they stopped for two heartbeats (completions that changed nothing else are quiet, see
        complete.lua), and routing goes by the heartbeat's latency instead, which is never
        older than that. (A speed told once and then never again would stick for ever: an
        agent whose tasks turned slow would keep a fast agent's prefetch.)"""
        told = self.speed.get(agent_id)
        if told is None or now - told[1] > 2 * self.d.settings.heartbeat_ms / 1000:
            return None
        return told[0]

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            inflight = self._inflight
            if inflight is not None:
                # (Redis runs calls it has whole or not at all, replies read or not: only the
                # reading stops here.)
                inflight.cancel()
                await asyncio.gather(inflight, return_exceptions=True)

    async def _run(self) -> None:
        backoff = 0.1
        while True:
            self._wake.clear()
            try:
                progressed = await self.step()
                backoff = 0.1
            except connection.TRANSIENT_ERRORS as exc:
                log.warning("%s: Redis unavailable (%s); retrying in %.1fs", self.capability, exc,
                            backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            except Exception:
                # Never die silently: a dead loop leaves a capability without dispatch.
                log.exception("%s: dispatch step failed; retrying in %.1fs", self.capability, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            if progressed:
                await asyncio.sleep(0)  # let other capabilities and the wake listener run
                continue
            try:
                await asyncio.wait_for(self._wake.wait(), self._idle_timeout())
            except TimeoutError:
                # (a lost wake-up message must not strand a task)
                self._maybe_queued = True
                self._forget_head()
                continue
            if not self._urgent:
                # Woken by a completion: gather the rest of its burst into the same round.
                await asyncio.sleep(ROUND_GATHER_S)
            self._urgent = False

    def _idle_timeout(self) -> float:
        timeout = self.d.settings.idle_tick_ms / 1000
        now = self.d.view.now_ms()
        not_before = self._next_housekeeping - time.monotonic()  # (due work waits for it)
        for due in (self._next_delayed_ms, self._next_deadline_ms):
            if due is not None:
                timeout = min(timeout, max((due - now) / 1000, not_before))
        timeout = min(timeout, self._next_sweep - time.monotonic())
        return max(0.001, timeout)

    async def step(self) -> bool:
        # Routing first: a task that just arrived is on its way before the housekeeping round
        # trip (what housekeeping makes ready is routed at the next step, which follows at once).
        moved = await self._route()
        if time.monotonic() >= self._next_housekeeping:
            moved += await self._housekeeping()
        if time.monotonic() >= self._next_sweep:
            moved += await self._reclaim_lapsed()
        return moved > 0

    async def _housekeeping(self) -> int:
        """Raw intake, due retries, due deadlines. While tasks flow this runs at most every
        HOUSEKEEPING_S (a retry or deadline is late by that much at worst) so that routing
        rounds, which follow every completion, do not each pay for it."""
        self._next_housekeeping = time.monotonic() + HOUSEKEEPING_S
        moved = await self._housekeeping_round()
        if moved:
            self._forget_head()  # tasks came into (or left) the queue
        return moved

    async def _housekeeping_round(self) -> int:
        now = self.d.view.now_ms()
        moved = 0
        pipe = self.d.redis.pipeline(transaction=False)
        pipe.xlen(self.keys.intake)
        pipe.zrangebyscore(self.keys.delayed, "-inf", now, start=0, num=SWEEP_BATCH)
        pipe.zrange(self.keys.delayed, 0, 0, withscores=True)
        pipe.zrangebyscore(self.keys.deadlines, "-inf", now, start=0, num=SWEEP_BATCH)
        pipe.zrange(self.keys.deadlines, 0, 0, withscores=True)
        intake_len, due_retries, delayed_head, due_deadlines, deadline_head = await pipe.execute()
        if intake_len:
            moved += await self.intake.take()
        if due_retries:
            moved += int(await self.d.scripts(
                protocol.promote_call(self.d.settings, self.capability, due_retries)))
        if due_deadlines:
            expired, no_agent, _ = await self.d.scripts(
                protocol.expire_call(self.d.settings, self.capability, due_deadlines))
            self.expired += int(expired) + int(no_agent)
            moved += int(expired) + int(no_agent) + (1 if len(due_deadlines) == SWEEP_BATCH else 0)
        if due_retries or due_deadlines:
            delayed_head = await self.d.redis.zrange(self.keys.delayed, 0, 0, withscores=True)
            deadline_head = await self.d.redis.zrange(self.keys.deadlines, 0, 0, withscores=True)
        self._next_delayed_ms = float(delayed_head[0][1]) if delayed_head else None
        self._next_deadline_ms = float(deadline_head[0][1]) if deadline_head else None
        return moved

    # -- leases -----------------------------------------------------------------------------

    async def _reclaim_lapsed(self) -> int:
        """Requeue tasks whose lease lapsed, in every inbox of this capability."""
        settings = self.d.settings
        self._next_sweep = time.monotonic() + min(settings.lease_ms / 3000, 5.0)
        agents = sorted(await self.d.redis.smembers(self.keys.inboxes))
        if not agents:
            return 0
        pipe = self.d.redis.pipeline(transaction=False)
        for agent_id in agents:
            pipe.xpending(self.keys.inbox(agent_id), "agents")
        summaries = await pipe.execute(raise_on_error=False)
        moved = 0
        for agent_id, summary in zip(agents, summaries, strict=True):
            if agent_id not in self.d.view.agents and self.d.view.refreshed:
                # Not registered (any more): whatever it left unread goes to other agents.
                moved += await inbox.release_unread(self.d.redis, self.d.scripts, settings,
                                                    self.capability, agent_id, "agent gone")
            if not isinstance(summary, dict) or not summary.get("pending"):
                continue
            moved += await inbox.reclaim_lapsed(
                self.d.redis, self.d.scripts, settings, self.capability, agent_id,
                self.d.dispatcher_id, settings.lease_ms, "lease lapsed")
        if moved:
            self.reclaimed += moved
            log.warning("%s: %d task(s) whose lease lapsed were handed on", self.capability, moved)
        return moved

    # -- routing ----------------------------------------------------------------------------

    def candidates(self) -> tuple[list[routing.Candidate], dict[str, str]]:
        """Agents serving this capability as routing sees them, and those out for their state."""
        out, filtered = [], {}
        now = time.monotonic()
        for record in self.d.view.serving(self.capability):
            state = self.d.view.state(record)
            if state.value != "healthy":
                filtered[record.agent_id] = f"state:{state.value}"
                continue
            stats = record.stats
            # Slots held by handlers that ran past their timeout (Python cannot stop them) run
            # nothing: the agent is sent work for the rest. (When they hold every slot the
            # agent leaves, and is replaced.)
            held = _number(stats.get("held_slots")) or 0.0
            held = min(max(held, 0.0), record.max_concurrency) if math.isfinite(held) else 0.0
            out.append(routing.Candidate(
                agent_id=record.agent_id,
                max_concurrency=max(1, record.max_concurrency - int(held)),
                load=self.loads.setdefault(record.agent_id, routing.InboxLoad()),
                latency_p50_ms=_number(stats.get("latency_p50_ms")),
                latency_baseline_ms=_number(stats.get("latency_baseline_ms")),
                stability=_number(stats.get("stability")),
                region=record.descriptor.region,
                version=record.descriptor.version,
                recovered_at_ms=record.recovered_at_ms,
                health=self.health.setdefault(record.agent_id, routing.AgentHealth()),
                recent_exec_ms=self.recent_speed(record.agent_id, now),
            ))
        return out, filtered

    def note_failures(self, agent_id: str, consecutive: int) -> bool:
        """Consecutive failures an agent's last completion left (from its wake-up message);
        True when they changed (routing may see the agent differently: route again)."""
        health = self.health.setdefault(agent_id, routing.AgentHealth())
        if consecutive > health.consecutive_failures:
            health.last_failure_ms = self.d.view.now_ms()
        elif consecutive == 0 and health.consecutive_failures:
            health.last_success_ms = self.d.view.now_ms()
        changed = consecutive != health.consecutive_failures
        health.consecutive_failures = consecutive
        return changed

    async def refresh_loads(self, agent_ids: list[str], health: bool = True) -> None:
        """Read exact inbox loads (length and pending count) and the agents' health counters
        (health=False: the loads only)."""
        pipe = self.d.redis.pipeline(transaction=False)
        if health:
            pipe.hgetall(self.keys.health)
        for agent_id in agent_ids:
            pipe.xlen(self.keys.inbox(agent_id))
            pipe.xpending(self.keys.inbox(agent_id), "agents")
        replies = await pipe.execute(raise_on_error=False)
        if health:
            if isinstance(replies[0], dict):
                self.health = routing.parse_health(replies[0])
            replies = replies[1:]
        for i, agent_id in enumerate(agent_ids):
            length, pending = replies[2 * i], replies[1 + 2 * i]
            running = pending.get("pending", 0) if isinstance(pending, dict) else 0
            self.note_load(agent_id, int(length) if isinstance(length, int) else 0, int(running))

    async def _ready_tasks(self, want: int, offset: int = 0) -> list[routing.ReadyTask]:
        """`want` ready tasks from position `offset` of the queue. A plain task is known from
        its queue score alone (its priority is in the score's fraction); the record is read
        only for tasks with routing constraints (session, region, version, an agent to avoid)."""
        r = self.d.redis
        if (offset == 0 and self._head is not None and not self._inflight_ids
                and (self._head_whole or len(self._head) >= want)):
            head = self._head[:want]  # what the last dispatch call saw at the queue's front
        else:
            skip = self._inflight_ids
            head = await r.zrange(self.keys.queue, offset, offset + want + len(skip) - 1, withscores=True)
            if skip:
                head = [entry for entry in head if entry[0] not in skip][:want]
        self._head = None
        if not head:
            return []
        hints = [(local_id, *routing.decode_queue_score(score)) for local_id, score in head]
        special = [local_id for local_id, _, constrained in hints if constrained]
        rows: dict[str, list[Any]] = {}
        owners: dict[str, str | None] = {}
        if special:
            pipe = r.pipeline(transaction=False)
            for local_id in special:
                pipe.hmget(self.keys.task(local_id), ROUTING_FIELDS)
            rows = dict(zip(special, await pipe.execute(), strict=True))
            sessions = sorted({row[0] for row in rows.values() if row[0]})
            if sessions:
                owners = dict(zip(sessions, await r.hmget(self.keys.sessions, sessions), strict=True))
        tasks = []
        for local_id, priority, constrained in hints:
            if not constrained:
                tasks.append(routing.ReadyTask(local_id, priority))
                continue
            session, region, extra, last_agent = rows[local_id]
            options = _routing_options(extra)
            tasks.append(routing.ReadyTask(
                local_id, priority, session or "", region or "",
                bool(options.get("region_strict", True)), str(options.get("version") or ""),
                last_agent or "", (owners.get(session) or "") if session else ""))
        return tasks

    async def _route(self) -> int:
        settings = self.d.settings
        # While grants stand, hand-offs by grant and their quiet completions change the granted
        # agents' loads without a word: every round reads them first. Grants stand only while
        # the queue is empty (a round that leaves tasks queued takes them back), so a round is
        # rare then: the tasks go straight to the agents. (The set standing is its last
        # writer's: the agents another dispatcher granted are read by the registry refresh,
        # once a tick.)
        self._unsure.update(agent_id for agent_id, _ in self._granted)
        if self._unsure:
            unsure, self._unsure = sorted(self._unsure), set()
            await self.refresh_loads(unsure, health=False)
        candidates, filtered = self.candidates()
        if not candidates:
            settled, _ = await self._settle()
            await self._grant(None)
            await self._pull(None)
            return settled
        now = self.d.view.now_ms()
        round_ = routing.RoutingRound(candidates, settings, now, self._rng, self.probes, filtered)
        # Setting a round up costs time per agent, and so does each agent's part of a dispatch
        # call: with many agents, take several tasks per eligible agent (as room allows) so that
        # cost is spread over as many decisions.
        want = min(round_.capacity, max(settings.dispatch_batch,
                                        min(ROUND_TASKS_PER_AGENT * len(round_.agents), MAX_ROUND_TASKS)))
        tasks = await self._ready_tasks(want) if want > 0 else []
        # The queue is empty once these are routed: the room left is granted, so that the next
        # tasks go to an agent without waiting for a round (see submit.lua).
        drained = want > 0 and len(tasks) < want
        # The choices, made as the tasks are read: tasks no agent can take now (a strict region
        # or a version no live agent has) stay queued, and must not hold back the tasks behind
        # them while there is room; so the round reads on past them, up to MAX_ROUND_TASKS
        # entries of the queue (a longer such front is left for the tasks' deadlines or the
        # no-agent timeout).
        choices: list[tuple[routing.ReadyTask, routing.Choice]] = []
        seen = settled = 0
        while True:
            seen += len(tasks)
            for task in tasks:
                choice = round_.choose(task)
                if choice is not None:
                    choices.append((task, choice))
            if drained or len(choices) >= want or round_.capacity <= 0 or seen >= MAX_ROUND_TASKS:
                break
            more = min(want, MAX_ROUND_TASKS - seen)
            moved, left = await self._settle()  # (the offset counts the queue without those calls)
            settled += moved
            if left:
                # Tasks those calls left are in the queue again, ahead of `seen`: the offset is
                # off by them. The next round reads from the front.
                drained = False
                break
            tasks = await self._ready_tasks(more, offset=seen)
            drained = len(tasks) < more
        if drained and self._inflight is not None:
            # The calls in flight may leave tasks in the queue (an inbox filled up meanwhile):
            # it is empty only if they left none.
            moved, left = await self._settle()
            settled += moved
            drained = left == 0
        if drained:
            self._maybe_queued = False
        # Agents pull only while tasks wait (an empty queue has grants instead): a completion
        # then looks at nothing more than the (missing) pull.
        await self._pull(round_ if self._maybe_queued else None)
        grant_round = round_ if drained or want <= 0 else None
        if not choices:
            moved, _ = await self._settle()
            await self._grant(grant_round)
            return settled + moved
        snapshot_id = await self._snapshot(round_)
        plan: dict[str, list[tuple[str, str]]] = {}
        for task, choice in choices:
            plan.setdefault(choice.agent_id, []).append(
                (task.local_id, routing.explanation(snapshot_id, choice)))
        by_id = {c.agent_id: c for c in candidates}
        batches = [protocol.AgentBatch(agent_id, routing.max_unread(by_id[agent_id], settings), items)
                   for agent_id, items in plan.items()]
        was_inflight = self._inflight is not None
        moved, _ = await self._settle()  # (one round's calls in flight at most: they keep their order)
        settled += moved
        # (Not after calls in flight that moved nothing: their agents took none, e.g. they had
        # left; the round then waits for its replies, and reports what really moved.)
        if not drained and len(choices) >= PIPELINE_MIN_TASKS and (moved or not was_inflight):
            # Tasks are left and the round was big: while Redis runs these calls, the next
            # round is routed (routing and Redis take turns otherwise, each idle half the time).
            # That round counts these tasks in their agents' loads and passes over them in the
            # queue; their replies, read before its own calls go out, give the exact loads.
            # dispatch.lua checks every hand-off itself, so a round routed on that view can
            # only find a task taken or an inbox full, never deliver a task twice.
            await self._grant(grant_round)  # (tasks are left: no grants, see above)
            self._send(batches, round_.reroutes > 0)
            await asyncio.sleep(0)  # (the calls go out now, not once this step is over)
            return settled + len(choices)
        progressed, _ = self._note_results(batches, await self._dispatch(batches), round_.reroutes > 0)
        await self._count()
        await self._grant(grant_round)  # (the room left; or, with tasks left, no grants)
        return settled + progressed

    def _note_results(self, batches: list[protocol.AgentBatch], results: list[protocol.DispatchResult],
                      rerouted: bool) -> tuple[int, int]:
        """Take in what a round's dispatch calls did: the agents' exact loads, the counts.
        Returns the tasks that moved (dispatched, expired, or found taken already) and those
        left in the queue (their agent's inbox was full)."""
        progressed = dispatched = left = 0
        for batch, result in zip(batches, results, strict=True):
            self.note_load(batch.agent_id, result.inbox_len, result.inbox_pending)
            dispatched += result.dispatched
            progressed += result.dispatched + result.expired + result.taken
            left += result.left
        self.reroutes += left  # the inbox filled up meanwhile: they go elsewhere
        self.dispatched += dispatched
        if dispatched and rerouted:
            self.reroutes += dispatched  # routed past agents whose inbox was full
        return progressed, left

    def _send(self, batches: list[protocol.AgentBatch], rerouted: bool) -> None:
        """Start a round's dispatch calls without waiting for them (see _route and _settle).
        Until their replies tell, their tasks count in their agents' loads as the round took
        them (RoutingRound counts each choice in the load it was made from). A load told
        meanwhile (a `free` or `took` wake-up) may have been read before these calls ran: an
        agent can then be sent more than it has room for, which dispatch.lua leaves queued
        for another round."""
        self._inflight = asyncio.ensure_future(self._dispatch(batches, last=False))
        self._inflight_batches = batches
        self._inflight_rerouted = rerouted
        self._inflight_ids = frozenset(local for batch in batches for local in batch.local_ids())
        self.pipelined_rounds += 1
        log.debug("%s: %d tasks in flight while the next round is routed", self.capability,
                  len(self._inflight_ids))

    async def _settle(self) -> tuple[int, int]:
        """Read the replies of the dispatch calls in flight, if any, and take them in. Returns
        the tasks they moved and those they left queued. (An error of theirs is raised here:
        the step fails and is retried.)"""
        inflight = self._inflight
        if inflight is None:
            return 0, 0
        batches, rerouted = self._inflight_batches, self._inflight_rerouted
        self._inflight, self._inflight_batches, self._inflight_ids = None, [], frozenset()
        try:
            results = await inflight
        except BaseException:
            # Whether they ran is not known: the next round reads these agents' loads first.
            self._unsure.update(batch.agent_id for batch in batches)
            raise
        out = self._note_results(batches, results, rerouted)
        await self._count()
        return out

    async def _grant(self, round_: routing.RoutingRound | None) -> None:
        """Leave the round's remaining room as grants, in weighted random order (or clear the
        grants: no room, or no agent). A grant set no different from the one standing is not
        written again until a third of its time to live has passed, or until submits used half
        of the grants standing (the reason for the round that calls this)."""
        settings = self.d.settings
        grants: list[str] = []
        # Agent and cold flag: an agent back from a failure in the grants as before must have
        # its grants rewritten at once (low-priority only), not when the old ones are refreshed.
        shape: list[tuple[str, bool]] = []
        probes: dict[str, int] = {}
        carry: list[str] = []
        if round_ is not None:
            snapshot_id = await self._snapshot(round_)
            by_id = {c.agent_id: c for c in round_.agents}
            for choice, low_only in round_.grants(settings.dispatch_batch):
                unread = routing.max_unread(by_id[choice.agent_id], settings)
                grants.append(f"{choice.agent_id}|{unread}|{snapshot_id}|{choice.score}|"
                              f"{'1' if low_only else ''}")
                shape.append((choice.agent_id, low_only))
                if choice.why == "probe":
                    probes[choice.agent_id] = self.probes[choice.agent_id]
            if grants:
                # A probe granted before and not taken yet stays in the set (grant.lua): the
                # round counted it as out, so it names the agent no more. (Not for an agent
                # the dispatcher no longer sees serving, whatever its circuit.)
                present = {c.agent_id for c in round_.candidates}
                carry = sorted(agent for agent in self._probe_grants
                               if agent in present and agent not in probes)
                shape += [(agent, False) for agent in carry]
        shape.sort()
        now = time.monotonic()
        if shape == self._granted and now < self._granted_until and not self._grants_running_low():
            # (The standing set names these agents as this one would: a probe granted here is
            # the standing grant of its agent.)
            self._probe_grants.update(probes)
            return
        if not grants and not self._granted and not self._probe_grants:
            return
        ttl_ms = GRANT_TTL_TICKS * settings.idle_tick_ms
        looking = carry if grants else sorted(self._probe_grants)
        reply = await self.d.scripts(protocol.grant_call(settings, self.capability, grants, ttl_ms, looking))
        unused = set(reply[1:])
        if grants:
            carried = {agent: self._probe_grants[agent] for agent in carry if agent in unused}
        else:
            # The grants are taken back: a probe they held unused never went out, and the
            # agent may have it from a dispatch round (else it would wait a lease for nothing).
            carried = {}
            for agent in unused:
                if self.probes.get(agent) == self._probe_grants.get(agent):
                    del self.probes[agent]
        self._probe_grants = {**carried, **probes}
        self._grants_written = self._grants_left = int(reply[0])
        self._granted = sorted([entry for entry in shape if entry[0] not in carry]
                               + [(agent, False) for agent in carried])
        self._granted_until = now + ttl_ms / 3000

    async def _pull(self, round_: routing.RoutingRound | None) -> None:
        """Let the agents the round found healthy (full or not) take ready tasks themselves as
        they finish others, while the queue is deep (see complete.lua): the routing decision
        for a task without constraints is then only which agent has a free slot first, and no
        round per completion is needed. Rewritten when the set changes (an agent's circuit
        opened, it went cold, it left), else refreshed before it expires."""
        settings = self.d.settings
        standing = round_.pulls() if round_ is not None else []
        limits = {c.agent_id: routing.max_unread(c, settings) for c, _ in standing}
        shape = sorted((c.agent_id, limits[c.agent_id], cold) for c, cold in standing)
        now = time.monotonic()
        if shape == self._pulls and (now < self._pulls_until or not shape):
            return
        pulls: dict[str, str] = {}
        if round_ is not None and standing:
            snapshot_id = await self._snapshot(round_)
            for c, cold in standing:
                pulls[c.agent_id] = (f"{limits[c.agent_id]}|{snapshot_id}|"
                                     f"{round_.score_of(c):g}|{'1' if cold else ''}")
        ttl_ms = GRANT_TTL_TICKS * settings.idle_tick_ms
        await self.d.scripts(protocol.pulls_call(settings, self.capability, pulls, ttl_ms))
        self._pulls = shape
        self._pulls_until = now + ttl_ms / 3000

    async def _dispatch(self, batches: list[protocol.AgentBatch],
                        last: bool = True) -> list[protocol.DispatchResult]:
        """Run a round's hand-offs: one dispatch call per DISPATCH_CALL_TASKS tasks (several
        agents each), all in one round trip. Each call is atomic on its own and short, so Redis
        never stalls on one. A call whose script Redis did not have yet is run again alone,
        which loads it. (Cluster pipelines refuse EVALSHA: there the calls go one by one.)"""
        if not batches:
            return []  # (no task of the round could go anywhere yet)
        calls: list[protocol.ScriptCall] = []
        groups: list[list[protocol.AgentBatch]] = []
        group: list[protocol.AgentBatch] = []
        size = 0
        for batch in batches:
            if group and size + len(batch.tasks) > DISPATCH_CALL_TASKS:
                groups.append(group)
                group, size = [], 0
            group.append(batch)
            size += len(batch.tasks)
        if group:
            groups.append(group)
        # The last call also returns the front of the queue it leaves, for the next round.
        peek = 0
        if last:  # (a call in flight while the next round is routed: that round reads the queue)
            peek = min(self.d.settings.dispatch_batch, max(PEEK_MIN, 2 * sum(len(b.tasks) for b in batches)))
        calls = [protocol.dispatch_call(self.d.settings, self.capability, g,
                                        peek if i == len(groups) - 1 else 0)
                 for i, g in enumerate(groups)]
        gen = self._head_gen
        out: list[protocol.DispatchResult] = []
        for group, reply in zip(groups, await self.d.scripts.run_all(calls), strict=True):
            results, peeked = protocol.parse_dispatch(reply, len(group))
            out += results
        if peek and gen == self._head_gen:  # (else the queue changed meanwhile: read it next time)
            self._head, self._head_whole = peeked, len(peeked) < peek
        return out

    async def _snapshot(self, round_: routing.RoutingRound) -> str:
        """Store what the round saw for `reach explain`: at most once a second while the
        same agents serve the capability (and at once when they change)."""
        now = time.monotonic()
        seen = frozenset([*(c.agent_id for c in round_.agents), *round_.filtered])
        if self._snapshot_id and now - self._snapshot_at < 1.0 and seen == self._snapshot_seen:
            return self._snapshot_id
        self._snapshot_seq += 1
        self._snapshot_id = f"{self.d.tag}.{self._snapshot_seq:x}"
        self._snapshot_at = now
        self._snapshot_seen = seen
        snapshot = {"dispatcher": self.d.dispatcher_id, **round_.snapshot()}
        await self.d.redis.set(self.keys.explain(self._snapshot_id), codec.dumps(snapshot),
                               px=EXPLAIN_TTL_MS)
        return self._snapshot_id

    async def _count(self) -> None:
        """Add this round's reroutes to the capability's stats (dispatch.lua counts dispatches)."""
        if not self.reroutes:
            return
        await self.d.redis.hincrby(self.keys.stats, "reroutes", self.reroutes)
        self.total_reroutes += self.reroutes
        self.reroutes = 0


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _routing_options(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = codec.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
