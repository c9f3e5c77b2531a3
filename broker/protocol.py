"""Typed calls of the Lua scripts: how arguments are laid out and how replies are read.

Every script has one builder here (pure: it returns the KEYS and ARGV lists) and, where the reply
needs it, one parser. The sync and async clients, the dispatcher and the worker all go through
these, so the layout each `.lua` header documents is written down once in Python too.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from broker import codec
from broker.errors import BadInput, InvalidPriority, QueueFull
from broker.ids import check_capability, new_task_id, split_task_id
from broker.keys import CapabilityKeys, Channels, RegistryKeys
from broker.settings import Settings
from broker.versions import parse_spec

MAX_LABEL_LEN = 256


@dataclass(frozen=True, slots=True)
class ScriptCall:
    name: str
    keys: list[str]
    args: list[str | int | float]


@dataclass(frozen=True, slots=True)
class SubmitRequest:
    """One validated task, ready to be written."""

    capability: str
    task_id: str
    payload: str
    priority: int = 5
    session_id: str = ""
    region: str = ""
    idempotency_key: str = ""
    timeout_ms: int = 0
    deadline_ms: int = 0
    trace_id: str = ""
    metadata: str = ""
    max_attempts: int = 3
    routing: str = ""
    intake_entry: str = ""
    wait: bool = False
    """The producer will wait for the outcome (it is then pushed to the task's done list)."""

    @property
    def local_id(self) -> str:
        return split_task_id(self.task_id)[1]


def _opt_text(name: str, value: object) -> str:
    if value is None:
        return ""
    if not isinstance(value, str) or not value or len(value) > MAX_LABEL_LEN:
        raise BadInput(f"{name} must be a non-empty string of at most {MAX_LABEL_LEN} characters")
    return value


def _opt_seconds(name: str, value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise BadInput(f"{name} must be a positive number of seconds, got {value!r}")
    if value > 10 * 365 * 86400:
        raise BadInput(f"{name} is more than ten years")
    return max(1, round(value * 1000))


def build_submit_request(
    settings: Settings,
    capability: str,
    payload: Any,
    *,
    priority: int = 5,
    session_id: str | None = None,
    region: str | None = None,
    idempotency_key: str | None = None,
    timeout_s: float | None = None,
    deadline_s: float | None = None,
    trace_id: str | None = None,
    metadata: dict[str, Any] | None = None,
    max_attempts: int | None = None,
    region_strict: bool = True,
    version: str | None = None,
    intake_entry: str = "",
    wait: bool = False,
) -> SubmitRequest:
    """Validate everything a producer passes; raise a specific BadInput before touching Redis."""
    check_capability(capability)
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 9:
        raise InvalidPriority(f"priority must be an int from 0 to 9 (higher runs first), got {priority!r}")
    encoded = codec.encode_payload(payload, settings.max_payload_bytes)
    meta = ""
    if metadata is not None:
        if not isinstance(metadata, dict):
            raise BadInput("metadata must be a JSON object (a dict with string keys)")
        meta = codec.encode_payload(metadata, settings.max_payload_bytes, where="metadata")
    if max_attempts is not None and (
        isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or not 1 <= max_attempts <= 100
    ):
        raise BadInput(f"max_attempts must be an int from 1 to 100, got {max_attempts!r}")
    timeout_ms = _opt_seconds("timeout_s", timeout_s) or settings.timeout_ms_for(capability)
    routing: dict[str, Any] = {}
    if not region_strict:
        if region is None:
            raise BadInput("region_strict=False needs a region to prefer")
        routing["region_strict"] = False
    if version is not None:
        version = _opt_text("version", version)
        parse_spec(version)  # BadInput now rather than a task no agent can ever match
        routing["version"] = version
    return SubmitRequest(
        capability=capability,
        task_id=new_task_id(capability),
        payload=encoded,
        priority=priority,
        session_id=_opt_text("session_id", session_id),
        region=_opt_text("region", region),
        idempotency_key=_opt_text("idempotency_key", idempotency_key),
        timeout_ms=timeout_ms,
        deadline_ms=_opt_seconds("deadline_s", deadline_s),
        trace_id=_opt_text("trace_id", trace_id) or secrets.token_hex(8),
        metadata=meta,
        max_attempts=max_attempts or settings.max_attempts_for(capability),
        routing=codec.dumps(routing) if routing else "",
        intake_entry=intake_entry,
        wait=wait,
    )


def submit_call(settings: Settings, requests: Sequence[SubmitRequest]) -> ScriptCall:
    capability = requests[0].capability
    if any(r.capability != capability for r in requests):
        raise BadInput("one submit call serves one capability")
    ck = CapabilityKeys(settings.prefix, capability)
    keys = [ck.queue, ck.events, ck.intake, ck.deadlines, ck.grants, ck.tokens, ck.stats, ck.granted]
    args: list[str | int | float] = [
        settings.max_queue_depth,
        settings.aging_ms,
        settings.idempotency_ttl_ms,
        settings.event_feed_maxlen,
        settings.prefix + ":",
        capability,
        settings.no_agent_timeout_ms,
        ck.inbox(""),
        settings.cold_start_max_priority,
    ]
    for r in requests:
        local = r.local_id
        keys += [ck.task(local), ck.idempotency(r.idempotency_key)]
        args += [
            r.task_id, local, r.payload, r.priority, r.session_id, r.region, r.idempotency_key,
            r.timeout_ms, r.deadline_ms, r.trace_id, r.metadata, r.max_attempts, r.routing,
            r.intake_entry, "1" if r.wait else "",
        ]
    return ScriptCall("submit", keys, args)


def parse_submit(capability: str, limit: int, reply: list[Any]) -> list[tuple[str, bool]]:
    """[(task id, created)] in request order; QueueFull when the batch did not fit."""
    if reply and reply[0] == "FULL":
        raise QueueFull(capability, int(reply[1]), limit)
    return [(reply[i + 1], reply[i] == "new") for i in range(0, len(reply), 2)]


def cancel_call(settings: Settings, task_id: str, agent_id: str) -> ScriptCall:
    """Cancel a task that the caller saw with `agent_id` ('' for none): see cancel.lua."""
    capability, local = split_task_id(task_id)
    ck = CapabilityKeys(settings.prefix, capability)
    return ScriptCall(
        "cancel",
        [ck.queue, ck.delayed, ck.task(local), ck.events, ck.inbox(agent_id)],
        [local, settings.event_feed_maxlen, settings.prefix + ":", settings.result_ttl_ms, agent_id],
    )


def watch_call(settings: Settings, task_id: str, what: str, flag: str, after: int = 0) -> ScriptCall:
    """Read a task's outcome ('outcome') or its events after `after` ('events') and register
    the wait with `flag`: 'd' (block on the done list) or 'w' (follow the channel); see watch.lua."""
    capability, local = split_task_id(task_id)
    return ScriptCall("watch", [CapabilityKeys(settings.prefix, capability).task(local)],
                      [what, flag, after])


@dataclass(frozen=True, slots=True)
class DispatchResult:
    inbox_len: int
    inbox_pending: int
    dispatched: int
    taken: int
    expired: int
    left: int


@dataclass(frozen=True, slots=True)
class AgentBatch:
    """The tasks one routing round gives one agent: local ids, or (local id, why JSON)."""

    agent_id: str
    max_unread: int
    tasks: Sequence[str | tuple[str, str]]

    def local_ids(self) -> list[str]:
        return [item if isinstance(item, str) else item[0] for item in self.tasks]


def dispatch_call(settings: Settings, capability: str, batches: Sequence[AgentBatch],
                  peek: int = 0) -> ScriptCall:
    """Hand each batch's tasks to its agent's inbox, in one script call (and return the first
    `peek` ready tasks left in the queue)."""
    ck = CapabilityKeys(settings.prefix, capability)
    task = ck.task
    keys = [ck.queue, ck.events, ck.dlq, ck.tokens, ck.stats, ck.sessions, ck.inboxes]
    keys += [ck.inbox(b.agent_id) for b in batches]
    args: list[str | int | float] = [
        settings.event_feed_maxlen, settings.prefix + ":", settings.result_ttl_ms, len(batches), peek,
    ]
    for b in batches:
        args += [b.agent_id, b.max_unread, len(b.tasks)]
    for b in batches:
        for item in b.tasks:
            local, why = (item, "") if isinstance(item, str) else item
            keys.append(task(local))
            args += [local, why]
    return ScriptCall("dispatch", keys, args)


def parse_dispatch(reply: list[Any], batches: int) -> tuple[list[DispatchResult], list[tuple[str, float]]]:
    """One result per batch, in order, and the ready tasks the call peeked at (local id, score)."""
    results = [DispatchResult(*(int(x) for x in reply[i:i + 6])) for i in range(0, 6 * batches, 6)]
    peeked = [(str(reply[i]), float(reply[i + 1])) for i in range(6 * batches, len(reply) - 1, 2)]
    return results, peeked


def grant_call(settings: Settings, capability: str, grants: Sequence[str], ttl_ms: int,
               probes: Sequence[str] = ()) -> ScriptCall:
    """Replace the capability's grants (`agent|most unread|round|score|low`, in order of use),
    carrying over the probe grants of the agents `probes` that the set replaced still held
    unused (see grant.lua): the reply is [grants standing, those agents...]."""
    ck = CapabilityKeys(settings.prefix, capability)
    return ScriptCall("grant", [ck.grants, ck.granted], [ttl_ms, len(probes), *probes, *grants])


def pulls_call(settings: Settings, capability: str, pulls: dict[str, str], ttl_ms: int) -> ScriptCall:
    """Replace the capability's standing pulls (agent id -> `most unread|round|score|low`)."""
    args: list[str | int | float] = [ttl_ms]
    for agent_id, pull in pulls.items():
        args += [agent_id, pull]
    return ScriptCall("pulls", [CapabilityKeys(settings.prefix, capability).pulls], args)


def promote_call(settings: Settings, capability: str, local_ids: Sequence[str]) -> ScriptCall:
    ck = CapabilityKeys(settings.prefix, capability)
    keys = [ck.delayed, ck.queue, ck.events] + [ck.task(local) for local in local_ids]
    args: list[str | int | float] = [
        settings.aging_ms, settings.event_feed_maxlen, settings.prefix + ":", capability, *local_ids,
    ]
    return ScriptCall("promote", keys, args)


@dataclass(frozen=True, slots=True)
class Delivery:
    """An inbox entry an agent read: which task, which attempt's fencing token."""

    entry_id: str
    local_id: str
    fence: str


@dataclass(slots=True)
class AcceptedTask:
    entry_id: str
    local_id: str
    fence: str
    task_id: str
    payload: str
    attempt: int
    timeout_ms: int
    deadline_at_ms: int
    trace_id: str
    session_id: str
    metadata: str
    max_attempts: int


@dataclass(slots=True)
class AcceptReply:
    refused: bool = False
    accepted: list[AcceptedTask] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)


def accept_call(
    settings: Settings, capability: str, agent_id: str, token: str, deliveries: Sequence[Delivery],
    *, started: bool = False,
) -> ScriptCall:
    """Accept deliveries before starting them, or (`started`) record that they were started."""
    ck = CapabilityKeys(settings.prefix, capability)
    keys = [ck.inbox(agent_id), ck.dlq, ck.events, ck.tokens]
    args: list[str | int | float] = [
        agent_id, token, settings.event_feed_maxlen, settings.prefix + ":", settings.result_ttl_ms,
        "1" if started else "0",
    ]
    for d in deliveries:
        keys.append(ck.task(d.local_id))
        args += [d.entry_id, d.fence]
    return ScriptCall("accept", keys, args)


def parse_accept_statuses(reply: list[Any]) -> list[str] | None:
    """Each delivery's status from an accept call that recorded starts (None: token refused)."""
    if reply and reply[0] == "REFUSED":
        return None
    return [str(reply[i]) for i in range(0, len(reply), 10)]


def parse_accept(deliveries: Sequence[Delivery], reply: list[Any]) -> AcceptReply:
    if reply and reply[0] == "REFUSED":
        return AcceptReply(refused=True)
    out = AcceptReply()
    for i, d in enumerate(deliveries):
        row = reply[i * 10 : i * 10 + 10]
        status = row[0]
        if status != "ok":
            out.skipped[status] = out.skipped.get(status, 0) + 1
            continue
        out.accepted.append(
            AcceptedTask(
                entry_id=d.entry_id,
                local_id=d.local_id,
                fence=d.fence,
                payload=row[1],
                attempt=int(row[2] or 1),
                timeout_ms=int(row[3] or 0),
                deadline_at_ms=int(row[4] or 0),
                trace_id=row[5],
                session_id=row[6],
                metadata=row[7],
                max_attempts=int(row[8] or 1),
                task_id=row[9],
            )
        )
    return out


def progress_call(
    settings: Settings, capability: str, local_id: str, agent_id: str, token: str, fence: str,
    data: dict[str, Any],
) -> ScriptCall:
    ck = CapabilityKeys(settings.prefix, capability)
    return ScriptCall(
        "progress",
        [ck.task(local_id), ck.events, ck.tokens],
        [agent_id, token, fence, codec.dumps(data), settings.event_feed_maxlen, settings.prefix + ":"],
    )


@dataclass(frozen=True, slots=True)
class Completion:
    entry_id: str
    local_id: str
    fence: str
    outcome: str
    body: str
    backoff_ms: int
    exec_ms: int


@dataclass(frozen=True, slots=True)
class CompleteReply:
    refused: bool
    inbox_len: int = 0
    inbox_pending: int = 0
    statuses: tuple[str, ...] = ()
    pulled: int = 0
    """Ready tasks this call took into the agent's inbox (a standing pull, see complete.lua)."""


def complete_call(
    settings: Settings, capability: str, agent_id: str, token: str, done: Sequence[Completion]
) -> ScriptCall:
    ck = CapabilityKeys(settings.prefix, capability)
    keys = [ck.inbox(agent_id), ck.delayed, ck.dlq, ck.events, ck.tokens, ck.health,
            ck.queue, ck.pulls, ck.stats, ck.grants, ck.granted]
    args: list[str | int | float] = [
        agent_id, token, settings.event_feed_maxlen, settings.prefix + ":",
        settings.result_ttl_ms, capability, settings.latency_ceiling_ms,
        settings.cold_start_max_priority, ck.task(""),
    ]
    for d in done:
        keys.append(ck.task(d.local_id))
        args += [d.entry_id, d.fence, d.outcome, d.body, d.backoff_ms, d.exec_ms]
    return ScriptCall("complete", keys, args)


def parse_complete(reply: list[Any]) -> CompleteReply:
    if reply and reply[0] == "REFUSED":
        return CompleteReply(refused=True)
    return CompleteReply(False, int(reply[0]), int(reply[1]), tuple(reply[3:]), int(reply[2]))


@dataclass(frozen=True, slots=True)
class Lease:
    entry_id: str
    local_id: str
    fence: str


def renew_call(
    settings: Settings, capability: str, agent_id: str, token: str, leases: Sequence[Lease]
) -> ScriptCall:
    ck = CapabilityKeys(settings.prefix, capability)
    keys = [ck.inbox(agent_id), ck.tokens] + [ck.task(lease.local_id) for lease in leases]
    args: list[str | int | float] = [agent_id, token]
    for lease in leases:
        args += [lease.entry_id, lease.fence]
    return ScriptCall("renew", keys, args)


def release_call(
    settings: Settings, capability: str, agent_id: str, reason: str, entries: Sequence[Lease]
) -> ScriptCall:
    """Put unread inbox entries (entry id, local id, fence) back into the ready queue."""
    ck = CapabilityKeys(settings.prefix, capability)
    keys = [ck.inbox(agent_id), ck.queue, ck.events]
    args: list[str | int | float] = [
        agent_id, settings.aging_ms, settings.event_feed_maxlen, settings.prefix + ":", capability,
        reason,
    ]
    for e in entries:
        keys.append(ck.task(e.local_id))
        args += [e.entry_id, e.fence]
    return ScriptCall("release", keys, args)


def reclaim_call(
    settings: Settings, capability: str, agent_id: str, consumer: str, reason: str,
    entries: Sequence[Lease],
) -> ScriptCall:
    """Requeue tasks whose lapsed inbox entries the dispatcher (`consumer`) has claimed."""
    ck = CapabilityKeys(settings.prefix, capability)
    keys = [ck.inbox(agent_id), ck.queue, ck.dlq, ck.events, ck.health]
    args: list[str | int | float] = [
        agent_id, consumer, settings.aging_ms, settings.event_feed_maxlen, settings.prefix + ":",
        settings.result_ttl_ms, capability, reason,
    ]
    for e in entries:
        keys.append(ck.task(e.local_id))
        args += [e.entry_id, e.fence]
    return ScriptCall("reclaim", keys, args)


def expire_call(settings: Settings, capability: str, local_ids: Sequence[str]) -> ScriptCall:
    ck = CapabilityKeys(settings.prefix, capability)
    keys = [ck.deadlines, ck.queue, ck.delayed, ck.dlq, ck.events]
    keys += [ck.task(local) for local in local_ids]
    args: list[str | int | float] = [
        settings.event_feed_maxlen, settings.prefix + ":", settings.result_ttl_ms,
        settings.no_agent_timeout_ms, ck.inbox(""), *local_ids,
    ]
    return ScriptCall("expire", keys, args)


def agent_state_call(settings: Settings, agent_id: str, known: str, new: str) -> ScriptCall:
    rk = RegistryKeys(settings.prefix)
    return ScriptCall("agent_state", [rk.agent(agent_id), rk.events, rk.changes, rk.rev],
                      [agent_id, known, new, settings.prefix + ":"])


def register_call(
    settings: Settings, agent_id: str, token_sha: str, descriptor_json: str, warmup_ms: int,
    capabilities: Sequence[str],
) -> ScriptCall:
    rk = RegistryKeys(settings.prefix)
    return ScriptCall(
        "register",
        [rk.agents, rk.agent(agent_id), rk.events, rk.capabilities, rk.changes, rk.rev],
        [agent_id, token_sha, descriptor_json, warmup_ms, settings.prefix + ":", *capabilities],
    )


def bind_call(settings: Settings, capability: str, agent_id: str, token_sha: str) -> ScriptCall:
    ck = CapabilityKeys(settings.prefix, capability)
    return ScriptCall(
        "bind", [ck.tokens, ck.inboxes, ck.inbox(agent_id)], [agent_id, token_sha]
    )


def heartbeat_call(
    settings: Settings, agent_id: str, token: str, stats: dict[str, Any], mode: str = "",
    significant: bool = True,
) -> ScriptCall:
    """A beat with the agent's numbers; `significant` when routing should re-read the record."""
    rk = RegistryKeys(settings.prefix)
    return ScriptCall(
        "heartbeat",
        [rk.agents, rk.agent(agent_id), rk.events, rk.changes, rk.rev],
        [agent_id, token, codec.dumps(stats), mode, settings.prefix + ":", "1" if significant else ""],
    )


def deregister_call(settings: Settings, agent_id: str, token: str) -> ScriptCall:
    rk = RegistryKeys(settings.prefix)
    return ScriptCall(
        "deregister", [rk.agents, rk.agent(agent_id), rk.events, rk.changes, rk.rev],
        [agent_id, token, settings.prefix + ":"],
    )


def dead_letter_raw_call(
    settings: Settings, capability: str, stream: str, group: str, entry_id: str, reason: str,
    error: str, raw: dict[str, Any],
) -> ScriptCall:
    ck = CapabilityKeys(settings.prefix, capability)
    return ScriptCall(
        "dead_letter_raw", [stream, ck.dlq],
        [group, entry_id, reason, error, codec.dumps(raw), capability],
    )


def channels(settings: Settings) -> Channels:
    return Channels(settings.prefix)
