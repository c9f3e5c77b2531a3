"""What one dispatcher has observed of one capability's agents: their exact inbox loads, the
speed their completions told (the wake-ups' and the health hash's), their health counters and
the probes it let through; and the candidates a routing round starts from.

Loads come from the dispatch calls' replies and the wake-ups (`free`, `took`), and are read
again from Redis where they may have changed unseen: the agents granted while grants stand
(submits hand them tasks, and their quiet completions end tasks, without telling: see
lua/_credits.lua), and those of dispatch calls whose replies were lost ("unsure").
"""

from __future__ import annotations

import math
import time

from broker.keys import AGENT_GROUP, CapabilityKeys
from broker.protocol.health import SPEED_KNOWN, SPEED_TELL_FACTOR, AgentHealth, parse_health
from dispatcher import candidates
from dispatcher.context import DispatcherContext
from dispatcher.routing import Candidate, InboxLoad


class Observations:
    def __init__(self, ctx: DispatcherContext, capability: str) -> None:
        self.ctx = ctx
        self.capability = capability
        self.keys = CapabilityKeys(ctx.settings.prefix, capability)
        self.loads: dict[str, InboxLoad] = {}
        self.speed: dict[str, tuple[float, float]] = {}
        """Per agent: mean execution ms of its latest completions the wake-ups told, and when
        (monotonic): see note_speed."""
        self.health: dict[str, AgentHealth] = {}
        self.probes: dict[str, int] = {}
        """Agents on probation (circuit open, or ejected) -> when their probe task went out."""
        self.unsure: set[str] = set()
        """Agents whose loads the next round reads first (see the module's docstring)."""

    def note_load(self, agent_id: str, outstanding: int, running: int) -> None:
        """An agent's exact inbox load: entries not finished, and those it has read (running);
        running -1: not known (the dispatch call did not need to look), so at most what it was."""
        if running < 0:
            before = self.loads.get(agent_id)
            running = min(before.running if before else 0, outstanding)
        self.loads[agent_id] = InboxLoad(outstanding, running)

    def note_speed(self, agent_id: str, finished: int, exec_ms: float, now: float | None = None) -> None:
        """Mean execution time of an agent's latest completions (a moving average), so the
        refill allowance follows its speed now rather than at its last heartbeat. `now`:
        monotonic seconds (default: the clock's)."""
        if finished <= 0 or not math.isfinite(exec_ms) or exec_ms < 0:
            return  # (nan parses as a float and would stick in the mean)
        now = time.monotonic() if now is None else now
        mean = exec_ms / finished
        # A speed no longer counted (recent_speed) is no part of the new one either: an agent
        # quiet for minutes whose tasks turned slow is slow now, not a fifth of it.
        before = self.recent_speed(agent_id, now)
        self.speed[agent_id] = (mean if before is None else 0.8 * before + 0.2 * mean, now)

    def recent_speed(self, agent_id: str, now: float) -> float | None:
        """The agent's speed from note_speed while the wake-ups keep telling it; None once
        they stopped for two heartbeats (completions that changed nothing else are quiet), and
        routing goes by the heartbeat's latency instead, which is never older than that."""
        told = self.speed.get(agent_id)
        if told is None or now - told[1] > 2 * self.ctx.settings.heartbeat_ms / 1000:
            return None
        return told[0]

    def note_told_speed(self, agent_id: str, speed_ms: float, samples: int) -> bool:
        """The speed an agent's completion told (see broker/protocol/health.py); True when it
        is news to routing (it became known, or moved SPEED_TELL_FACTOR times either way): the
        agent may be slower than the fleet now, or no longer, so route again at once."""
        health = self.health.setdefault(agent_id, AgentHealth())
        before, known_before = health.speed_ms, health.speed_samples >= SPEED_KNOWN
        health.speed_ms, health.speed_samples = speed_ms, samples
        if samples < SPEED_KNOWN:
            return False
        return (not known_before or before <= 0 or speed_ms >= SPEED_TELL_FACTOR * before
                or before >= SPEED_TELL_FACTOR * speed_ms)

    def note_failures(self, agent_id: str, consecutive: int) -> bool:
        """Consecutive failures an agent's last completion left; True when they changed
        (routing may see the agent differently: route again)."""
        health = self.health.setdefault(agent_id, AgentHealth())
        now = self.ctx.view.now_ms()
        if consecutive > health.consecutive_failures:
            health.last_failure_ms = now
        elif consecutive == 0 and health.consecutive_failures:
            health.last_success_ms = now
        changed = consecutive != health.consecutive_failures
        health.consecutive_failures = consecutive
        return changed

    async def refresh(self, agent_ids: list[str], health: bool = True) -> None:
        """Read exact inbox loads (length and pending count) and the agents' health counters
        (health=False: the loads only)."""
        pipe = self.ctx.redis.pipeline(transaction=False)
        if health:
            pipe.hgetall(self.keys.health)
        for agent_id in agent_ids:
            pipe.xlen(self.keys.inbox(agent_id))
            pipe.xpending(self.keys.inbox(agent_id), AGENT_GROUP)
        replies = await pipe.execute(raise_on_error=False)
        if health:
            if isinstance(replies[0], dict):
                self.health = parse_health(replies[0])
            replies = replies[1:]
        for i, agent_id in enumerate(agent_ids):
            length, pending = replies[2 * i], replies[1 + 2 * i]
            running = pending.get("pending", 0) if isinstance(pending, dict) else 0
            self.note_load(agent_id, int(length) if isinstance(length, int) else 0, int(running))

    async def refresh_unsure(self, granted: list[str]) -> None:
        """Before a round: read the loads that may have changed unseen (the granted agents',
        and those `unsure` names)."""
        self.unsure.update(granted)
        if self.unsure:
            unsure, self.unsure = sorted(self.unsure), set()
            await self.refresh(unsure, health=False)

    def candidates(self) -> tuple[list[Candidate], dict[str, str]]:
        """Agents serving this capability as routing sees them, and those out for their state."""
        view = self.ctx.view
        now = time.monotonic()
        return candidates.gather(
            view.serving(self.capability), view.state,
            lambda agent_id: self.loads.setdefault(agent_id, InboxLoad()),
            lambda agent_id: self.health.setdefault(agent_id, AgentHealth()),
            lambda agent_id: self.recent_speed(agent_id, now))
