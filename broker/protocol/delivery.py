"""Inbox entries, and the scripts that put tasks in inboxes or take them out.

An inbox entry (written by deliver in lua/_delivery.lua) carries the task's local id (`id`) and
the attempt's fencing token (`fence`) and, so that the agent can start the task the moment it
reads it, `p` the payload and `x` the rest, packed as

    <attempt>|<timeout ms>|<deadline at ms>|<max attempts>|<trace>|<session id>|<metadata>

(metadata last: it may hold '|'; trace: the task's trace context as its record keeps it,
broker/protocol/trace.py). An entry without `p` (a payload too large to ride along) is
accepted first (accept.lua reads the record).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from broker.ids import is_local_id
from broker.keys import CapabilityKeys
from broker.protocol.cache import cached
from broker.protocol.calls import ScriptCall, Status, feed_args, is_refused, wake_channel
from broker.protocol.packed_policy import policy_defaults
from broker.protocol.trace import TraceContext, new_traceparent, parse_stored
from broker.settings import Settings

_MAX_MS = 253_402_300_799_999
"""The latest millisecond time a datetime holds (9999-12-31): past it an entry is no delivery."""


@dataclass(frozen=True, slots=True)
class Lease:
    """A delivery of a task to an agent: its inbox entry and the attempt's fencing token."""

    entry_id: str
    local_id: str
    fence: str


@dataclass(slots=True)
class AcceptedTask:
    """What starting a task needs, from its inbox entry or from accept.lua."""

    entry_id: str
    local_id: str
    fence: str
    task_id: str
    payload: str
    attempt: int
    timeout_ms: int
    deadline_at_ms: int
    trace: str
    """The task's trace context as its record keeps it (see trace_context)."""
    session_id: str
    metadata: str
    max_attempts: int

    def trace_context(self) -> TraceContext:
        """Its trace context (a new trace for a record that holds none, or a corrupt one)."""
        return parse_stored(self.trace) or TraceContext(new_traceparent())


def parse_lease(entry_id: str, fields: dict[str, str] | None) -> Lease | None:
    """The delivery an inbox entry stands for, or None when the entry is not a valid one."""
    if not fields:
        return None
    local, fence = fields.get("id", ""), fields.get("fence", "")
    if not (is_local_id(local) and fence.isascii() and fence.isdigit()):
        return None
    return Lease(entry_id, local, fence)


def parse_entry(capability: str, entry_id: str, fields: dict[str, str] | None) -> AcceptedTask | None:
    """The task an inbox entry hands over, when the entry carries what starting it needs; None
    when it does not (the agent then accepts it first) or is no valid delivery."""
    # (checks what parse_lease checks, without building a Lease: this runs once per task)
    if not fields or "p" not in fields:
        return None
    local, fence = fields.get("id", ""), fields.get("fence", "")
    if not (is_local_id(local) and fence.isascii() and fence.isdigit()):
        return None
    packed = fields.get("x", "").split("|", 6)
    if len(packed) != 7:
        return None
    try:
        attempt, timeout_ms, deadline_at, max_attempts = (
            int(packed[0]), int(packed[1]), int(packed[2]), int(packed[3]))
    except ValueError:
        return None
    if not (0 <= attempt <= _MAX_MS and 0 <= timeout_ms <= _MAX_MS and 0 <= deadline_at <= _MAX_MS
            and 0 <= max_attempts <= _MAX_MS):
        return None  # (a forged or corrupt entry must not crash the reader on a datetime)
    return AcceptedTask(
        entry_id=entry_id, local_id=local, fence=fence, task_id=f"{capability}:{local}",
        payload=fields["p"], attempt=attempt, timeout_ms=timeout_ms, deadline_at_ms=deadline_at,
        trace=packed[4], session_id=packed[5], metadata=packed[6], max_attempts=max_attempts,
    )


# -- dispatch.lua ------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class AgentBatch:
    """The tasks one routing round gives one agent: local ids, or (local id, explanation)."""

    agent_id: str
    max_unread: int
    tasks: Sequence[str | tuple[str, str]]

    def local_ids(self) -> list[str]:
        return [item if isinstance(item, str) else item[0] for item in self.tasks]


@dataclass(frozen=True, slots=True)
class DispatchResult:
    inbox_len: int
    inbox_pending: int
    """-1: not looked at (the inbox was far from its limit)."""
    dispatched: int
    taken: int
    """Already taken by another dispatcher (or no longer queued)."""
    expired: int
    left: int
    """Left in the queue: the inbox filled up (or the agent left)."""


def dispatch_call(settings: Settings, capability: str, batches: Sequence[AgentBatch],
                  peek: int = 0) -> ScriptCall:
    """Hand each batch's tasks to its agent's inbox, in one script call (and return the first
    `peek` ready tasks left in the queue)."""
    ck = CapabilityKeys(settings.prefix, capability)
    task = ck.task
    keys = [ck.queue, ck.events, ck.dlq, ck.tokens, ck.stats, ck.sessions, ck.policy, ck.rate]
    keys += [ck.inbox(b.agent_id) for b in batches]
    args: list[str | int | float] = [*feed_args(settings), settings.result_ttl_ms, len(batches), peek,
                                     policy_defaults(settings, capability)]
    for b in batches:
        args += [b.agent_id, b.max_unread, len(b.tasks)]
    for b in batches:
        for item in b.tasks:
            local, why = (item, "") if isinstance(item, str) else item
            keys.append(task(local))
            args += [local, why]
    return ScriptCall("dispatch", keys, args)


HOLD_PAUSED = -1
HOLD_AT_MAX_RUNNING = -2


@dataclass(frozen=True, slots=True)
class DispatchReply:
    results: list[DispatchResult]
    """One per batch, in order."""
    peeked: list[tuple[str, float]]
    """The ready tasks left at the queue's front (local id, score)."""
    hold: int = 0
    """Why the policy let fewer tasks start than asked: 0 it did not, HOLD_PAUSED,
    HOLD_AT_MAX_RUNNING, or the ms until the rate allows the next start."""


def parse_dispatch(reply: list[Any], batches: int) -> DispatchReply:
    hold = int(reply[0])
    results = [DispatchResult(*(int(x) for x in reply[i:i + 6])) for i in range(1, 1 + 6 * batches, 6)]
    peeked = [(str(reply[i]), float(reply[i + 1])) for i in range(1 + 6 * batches, len(reply) - 1, 2)]
    return DispatchReply(results, peeked, hold)


# -- accept.lua --------------------------------------------------------------------------------

@dataclass(slots=True)
class AcceptReply:
    refused: bool = False
    accepted: list[AcceptedTask] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)


def accept_call(
    settings: Settings, capability: str, agent_id: str, token: str, deliveries: Sequence[Lease],
    *, started: bool = False, ran_ms: Sequence[int] = (),
) -> ScriptCall:
    """Accept deliveries before starting them, or (`started`) record that they were started,
    `ran_ms[i]` ms ago for delivery i (0 when not given)."""
    keys_head, args_head, task_prefix = cached(
        settings, ("accept", capability, agent_id), lambda: _accept_frame(settings, capability, agent_id))
    keys = list(keys_head)
    args: list[str | int | float] = list(args_head)
    args[1] = token
    if started:
        args[5] = "1"
    for i, d in enumerate(deliveries):
        keys.append(task_prefix + d.local_id)
        args += [d.entry_id, d.fence, ran_ms[i] if i < len(ran_ms) else 0]
    return ScriptCall("accept", keys, args)


def _accept_frame(settings: Settings, capability: str,
                  agent_id: str) -> tuple[tuple[str, ...], tuple[str | int | float, ...], str]:
    """accept.lua's keys and arguments before the deliveries' (the token's place left '')."""
    ck = CapabilityKeys(settings.prefix, capability)
    keys = (ck.inbox(agent_id), ck.dlq, ck.events, ck.tokens, ck.stats, ck.policy)
    maxlen, task_channels = feed_args(settings)
    args = (agent_id, "", maxlen, task_channels, settings.result_ttl_ms, "0",
            policy_defaults(settings, capability))
    return keys, args, ck.task_prefix


def parse_accept_statuses(reply: list[Any]) -> list[str] | None:
    """Each delivery's status from an accept call that recorded starts (None: token refused)."""
    if is_refused(reply):
        return None
    return [str(reply[i]) for i in range(0, len(reply), 10)]


def parse_accept(deliveries: Sequence[Lease], reply: list[Any]) -> AcceptReply:
    if is_refused(reply):
        return AcceptReply(refused=True)
    out = AcceptReply()
    for i, d in enumerate(deliveries):
        row = reply[i * 10 : i * 10 + 10]
        status = row[0]
        if status != Status.OK:
            out.skipped[status] = out.skipped.get(status, 0) + 1
            continue
        out.accepted.append(AcceptedTask(
            entry_id=d.entry_id, local_id=d.local_id, fence=d.fence, payload=row[1],
            attempt=int(row[2] or 1), timeout_ms=int(row[3] or 0), deadline_at_ms=int(row[4] or 0),
            trace=row[5], session_id=row[6], metadata=row[7], max_attempts=int(row[8] or 1),
            task_id=row[9],
        ))
    return out


# -- release.lua, reclaim.lua ------------------------------------------------------------------

def release_call(
    settings: Settings, capability: str, agent_id: str, reason: str, entries: Sequence[Lease]
) -> ScriptCall:
    """Put unread inbox entries back into the ready queue (the reply: how many)."""
    ck = CapabilityKeys(settings.prefix, capability)
    keys = [ck.inbox(agent_id), ck.queue, ck.events, ck.stats, ck.policy]
    maxlen, task_channels = feed_args(settings)
    args: list[str | int | float] = [
        agent_id, policy_defaults(settings, capability), maxlen, task_channels, capability, reason,
        wake_channel(settings),
    ]
    for e in entries:
        keys.append(ck.task(e.local_id))
        args += [e.entry_id, e.fence]
    return ScriptCall("release", keys, args)


@dataclass(frozen=True, slots=True)
class ReclaimReply:
    requeued: int
    failed: int
    """Out of attempts: failed into the dead-letter stream."""
    skipped: int


def reclaim_call(
    settings: Settings, capability: str, agent_id: str, consumer: str, reason: str,
    entries: Sequence[Lease],
) -> ScriptCall:
    """Requeue tasks whose lapsed inbox entries the dispatcher (`consumer`) has claimed."""
    ck = CapabilityKeys(settings.prefix, capability)
    keys = [ck.inbox(agent_id), ck.queue, ck.dlq, ck.events, ck.health, ck.stats, ck.policy]
    maxlen, task_channels = feed_args(settings)
    args: list[str | int | float] = [
        agent_id, consumer, policy_defaults(settings, capability), maxlen, task_channels,
        settings.result_ttl_ms, capability, reason, wake_channel(settings),
    ]
    for e in entries:
        keys.append(ck.task(e.local_id))
        args += [e.entry_id, e.fence]
    return ScriptCall("reclaim", keys, args)


def parse_reclaim(reply: list[Any]) -> ReclaimReply:
    return ReclaimReply(int(reply[0]), int(reply[1]), int(reply[2]))
